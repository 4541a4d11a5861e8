"""Which requests the next engine step runs: delayed batching and the prefill token budget.

Pure functions of the runnable requests, so every rule is unit-tested without an engine or a
clock (``tests/runtime/test_core.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .request import RequestState


@dataclass(frozen=True, kw_only=True)
class BatchLimits:
    max_batch_size: int  # rows per step
    max_prefill_tokens: int  # prefill/extend tokens per step (a longer prompt is chunked)
    max_wait_s: float  # longest a runnable request waits for its batch threshold


def batch_due(ready: int, active: int, threshold: int, waited_s: float, max_wait_s: float) -> bool:
    """Delayed batching: step once ``min(B(N), N)`` requests are ready here, or once the oldest ready
    one has waited ``max_wait_s`` (no starvation). ``min(.., N)``: with every active request here
    there is nothing more to wait for."""
    if ready == 0:
        return False
    active = max(active, 1)
    return ready >= min(threshold, active) or waited_s >= max_wait_s


def wait_left(oldest_ready_since: float | None, now: float, max_wait_s: float) -> float | None:
    """Seconds until the oldest ready request's wait runs out (0: now); None with nothing ready."""
    if oldest_ready_since is None:
        return None
    return max(0.0, max_wait_s - (now - oldest_ready_since))


def select_rows(candidates: Iterable[RequestState], limits: BatchLimits) -> list[tuple[RequestState, int]]:
    """(request, tokens to feed) in FIFO order, up to ``max_batch_size`` rows.

    Decode rows feed one token. Prefill/extend rows share ``max_prefill_tokens``; a row that does
    not fit whole is chunked to what is left, and a later row finds no budget left and waits. The
    first prefill row always gets a chunk, so a prompt longer than the budget still progresses.
    """
    rows: list[tuple[RequestState, int]] = []
    budget = limits.max_prefill_tokens
    for request in candidates:
        if len(rows) == limits.max_batch_size:
            break
        pending = len(request.token_ids) - request.cached
        if pending > 1:
            chunk = min(pending, budget) if rows else min(pending, limits.max_prefill_tokens)
            if chunk <= 0:
                continue
            budget -= chunk
        else:
            chunk = pending
        rows.append((request, chunk))
    return rows
