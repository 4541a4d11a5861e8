"""The engine oracle scenario shared by every engine's tests: mixed prefills, requests away for
several steps, a late arrival, extends with foreign tokens; and its comparison with ``generate``."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tokenrouter.engine.base import StepRow

PROMPT_LENGTHS = {"a": 1, "b": 6, "c": 13, "d": 29}
LATE_PROMPT = ("e", 9)  # joins mid-run: its prefill shares a step with decodes
EXTERNAL = [101, 2020, 303]  # tokens "another model" produced while c and d were away


@dataclass
class Segment:
    context: list[int]  # everything fed before the segment's first sample
    tokens: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)


@dataclass
class Request:
    fed: list[int] = field(default_factory=list)
    last: int | None = None  # sampled, not yet fed
    segments: list[Segment] = field(default_factory=list)


def run_step(engine, requests: dict[str, Request], feeds: dict[str, list[int] | None]) -> None:
    """One engine step; ``None`` in ``feeds`` means a decode (feed the last sampled token)."""
    rows = []
    for seq_id, tokens in feeds.items():
        request = requests[seq_id]
        new = [request.last] if tokens is None else tokens
        request.fed += new
        if tokens is not None:
            request.segments.append(Segment(context=list(request.fed)))
        rows.append(StepRow(seq_id, new))
    result = engine.step(rows)
    assert result.seq_ids == list(feeds)
    for seq_id, token, logits, position in zip(result.seq_ids, result.sampled.tolist(), result.logits,
                                               result.positions.tolist()):
        request = requests[seq_id]
        assert position == len(request.fed) == engine.num_cached(seq_id)
        request.last = token
        request.segments[-1].tokens.append(token)
        request.segments[-1].logits.append(logits)


def scenario(engine, prompts: dict[str, list[int]]) -> dict[str, Request]:
    """Mixed prefills, c and d away for 4 steps, e arriving late, then extends mixed with decodes."""
    requests = {seq_id: Request() for seq_id in prompts}
    for seq_id in prompts:
        engine.add_sequence(seq_id)
    run_step(engine, requests, {k: prompts[k] for k in "abcd"})
    run_step(engine, requests, dict.fromkeys("abcd"))
    for step in range(4):  # c and d pending: their blocks must survive untouched
        feeds = dict.fromkeys("ab")
        if step == 1:
            feeds["e"] = prompts["e"]
        elif step > 1:
            feeds["e"] = None
        run_step(engine, requests, feeds)
    # c keeps its own last sample and gets the external tokens; d's last sample is discarded.
    run_step(engine, requests, {"a": None, "c": [requests["c"].last] + EXTERNAL, "d": EXTERNAL[:1], "e": None,
                                "b": None})
    for _ in range(4):
        run_step(engine, requests, dict.fromkeys("abcde"))
    return requests


def random_prompts(seed: int, vocab: int) -> dict[str, list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = dict(PROMPT_LENGTHS, **dict([LATE_PROMPT]))
    return {k: torch.randint(3, vocab, (n,), generator=generator).tolist() for k, n in lengths.items()}


def assert_matches_reference(requests: dict[str, Request], model, reference, atol: float, label: str) -> None:
    """Tokens exactly; logits within ``atol`` (bf16 logits near 16 are 0.125 apart)."""
    assert [len(requests[k].segments) for k in "abcde"] == [1, 1, 2, 2, 1]
    for seq_id, request in requests.items():
        for segment in request.segments:
            tokens, logits = reference(model, segment.context, len(segment.tokens))
            assert segment.tokens == tokens, f"{label}: {seq_id} after {len(segment.context)} tokens"
            torch.testing.assert_close(torch.stack(segment.logits), logits, atol=atol, rtol=1e-4)
