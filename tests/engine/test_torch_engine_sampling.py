"""Per-request sampling through the engine: reproducible by (seed, position), whatever the batch."""

from __future__ import annotations

import torch

from tokenrouter.engine.base import SamplingParams, StepRow
from tokenrouter.engine.sampling import sample_tokens

PROMPT = [11, 12, 13, 14, 15, 16, 17]
HOT = SamplingParams(temperature=1.0, top_p=0.95, top_k=200, seed=1234)


def decode(engine, seq_id, prompt, sampling, steps, *, neighbours=(), pause_at=None):
    """Sample ``steps`` tokens for ``seq_id``; neighbours (greedy or other seeds) share every step.

    With ``pause_at``, the sequence sits out two steps there while the neighbours go on.
    """
    for name in (seq_id, *neighbours):
        engine.add_sequence(name)
    feeds = {seq_id: prompt, **{name: [20 + i, 21, 22] for i, name in enumerate(neighbours)}}
    params = {seq_id: sampling, **{name: SamplingParams(temperature=0.7, seed=i) for i, name in enumerate(neighbours)}}
    out: list[int] = []
    step = 0
    while len(out) < steps:
        pausing = pause_at is not None and pause_at <= step < pause_at + 2 and neighbours
        rows = [StepRow(name, feeds[name], params[name]) for name in feeds if not (pausing and name == seq_id)]
        result = engine.step(rows)
        for name, token in zip(result.seq_ids, result.sampled.tolist()):
            feeds[name] = [token]
            if name == seq_id:
                out.append(token)
        step += 1
    return out


def test_sampling_is_reproducible_across_batches_and_pauses(tiny_pair, make_engine):
    alone = decode(make_engine(tiny_pair["small"]), "r", PROMPT, HOT, 12)
    crowded = decode(make_engine(tiny_pair["small"]), "r", PROMPT, HOT, 12, neighbours=("n0", "n1", "n2"), pause_at=3)
    assert crowded == alone
    greedy = decode(make_engine(tiny_pair["small"]), "r", PROMPT, SamplingParams(), 12)
    assert alone != greedy, "temperature 1.0 over 12 tokens should leave the greedy path"
    other_seed = decode(make_engine(tiny_pair["small"]), "r", PROMPT, SamplingParams(temperature=1.0, seed=99), 12)
    assert other_seed != alone


def test_top_k_one_is_greedy(tiny_pair, make_engine):
    top1 = SamplingParams(temperature=1.5, top_k=1, seed=5)
    assert decode(make_engine(tiny_pair["small"]), "r", PROMPT, top1, 8) == decode(
        make_engine(tiny_pair["small"]), "r", PROMPT, SamplingParams(), 8
    )


def test_sampled_tokens_follow_returned_logits(tiny_pair, make_engine):
    engine = make_engine(tiny_pair["small"])
    params = [HOT, SamplingParams(), SamplingParams(temperature=0.5, top_p=0.5, seed=7)]
    for i in range(3):
        engine.add_sequence(i)
    result = engine.step([StepRow(i, PROMPT[: i + 2], p) for i, p in enumerate(params)])
    assert result.positions.tolist() == [2, 3, 4]
    expected = sample_tokens(result.logits, params, result.positions.tolist())
    assert torch.equal(result.sampled, expected)
