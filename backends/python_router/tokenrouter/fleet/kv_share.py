"""What one of M entry workers admits against: its own model's KV whole (its own engine), and 1/M of
one instance's KV for each peer model.

Why this cannot over-commit a peer instance, whatever the placement: an entry reserves a request's KV
on every model before it starts (admission.py) and frees it when the request ends, so the requests of
one entry pinned anywhere in a peer pool never need more than its share of one instance. The entry's
messages to an instance arrive in order (one session per sending instance), so a request an instance
still holds was reserved, together with the others it holds from that entry, at one moment: what an
instance holds from one entry fits that entry's share, and the M shares add up to one instance. A
peer step therefore never runs out of KV, and nothing waits on KV a peer cannot free (a request only
waits for admission at its entry, where finished requests give their share back); delayed batching
waits at most ``max_wait_ms`` (batching.py), so it cannot deadlock either. The rule is conservative:
K instances do not admit K times the requests (the pool's KV is counted as one instance's).

It holds while at most M entry workers run at once (the launcher starts M, and starts one again only
after it exited).
"""

from __future__ import annotations

from ..config import TokenRouterConfig
from ..runtime.assembly import kv_capacity


def entry_capacities(config: TokenRouterConfig, entries: int) -> dict[str, tuple[int, int]]:
    """model -> (KV blocks this entry admits against, block size), for one of ``entries`` entry workers."""
    if entries < 1:
        raise ValueError(f"entries must be >= 1, got {entries}")
    capacities = {}
    for model, spec in config.models.items():
        blocks, block_size = kv_capacity(spec)
        capacities[model] = (blocks if model == config.entry else blocks // entries, block_size)
    return capacities
