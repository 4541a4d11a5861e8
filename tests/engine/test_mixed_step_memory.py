"""Mixed steps do not pad decode rows to a prefill's length: attention memory stays near each row's own need.

The GPU config runs up to 64 rows per step with 2048-token prompts. With one padded SDPA call, a
2048-token prefill next to 63 decodes would build 64 x 2048 query rows of scores (64x the need).
These tests bound the attention tensors of such a step by their shapes, never by time.
"""

from __future__ import annotations

import pytest
import torch

from tokenrouter.engine import paged_attention
from tokenrouter.engine.base import StepRow
from tokenrouter.engine.paged_attention import PagedKVCache, StepLayout, query_groups

BLOCK = 16
PREFILL = 2048
DECODES = 63
DECODE_CONTEXT = 2047  # cached tokens of each decode row before this step


def _mixed_layout() -> tuple[StepLayout, list[int], list[int]]:
    """One 2048-token prefill (row 0) next to 63 decodes, each with 2047 cached tokens."""
    blocks_per_row = -(-PREFILL // BLOCK)
    tables = [list(range(r * blocks_per_row, (r + 1) * blocks_per_row)) for r in range(1 + DECODES)]
    starts, counts = [0] + [DECODE_CONTEXT] * DECODES, [PREFILL] + [1] * DECODES
    cache = PagedKVCache(1, len(tables) * blocks_per_row, BLOCK, 1, 2, torch.float32, torch.device("cpu"))
    return StepLayout.build(cache, tables, starts, counts, BLOCK, torch.device("cpu")), starts, counts


def test_decodes_and_a_prefill_attend_in_separate_groups() -> None:
    layout, _, _ = _mixed_layout()
    shapes = sorted(tuple(group.mask.shape) for group in layout.groups)
    assert shapes == [(1, 1, PREFILL, PREFILL), (DECODES, 1, 1, PREFILL)]


def test_score_elements_of_a_mixed_step_stay_within_twice_the_rows_own_need() -> None:
    layout, starts, counts = _mixed_layout()
    scores = sum(group.mask.numel() for group in layout.groups)  # per head: queries x keys, padding included
    need = sum(count * (start + count) for start, count in zip(starts, counts))  # each row's own queries x context
    padded_all = (1 + DECODES) * PREFILL * PREFILL  # one SDPA call over every row, as before
    assert need <= scores <= 2 * need
    assert scores * 30 < padded_all
    # gathered keys per group: the prefill's context once, each decode's context once
    gathered = sum(group.block_tables.numel() for group in layout.groups) * BLOCK
    assert gathered == (1 + DECODES) * PREFILL


@pytest.mark.parametrize("counts, expected", [
    ([1, 1, 1], [[0, 1, 2]]),
    ([2048, 1, 1, 3, 4, 5], [[1, 2], [3, 4], [5], [0]]),  # 3 and 4 share the 3-4 bucket; 5 starts 5-8
    ([8, 5, 9], [[0, 1], [2]]),
])
def test_query_groups_bound_query_padding_to_twice(counts: list[int], expected: list[list[int]]) -> None:
    groups = query_groups(counts)
    assert groups == expected
    for rows in groups:
        assert max(counts[r] for r in rows) < 2 * min(counts[r] for r in rows)


def test_engine_step_runs_each_group_in_its_own_attention_call(tiny_pair, make_engine, monkeypatch) -> None:
    """A real mixed step on a tiny model: no SDPA call pads a decode row to the prefill's queries."""
    engine = make_engine(tiny_pair["small"], block_size=4, kv_cache_tokens=1024)
    decodes = [f"d{i}" for i in range(7)]
    for seq_id in decodes:
        engine.add_sequence(seq_id)
    first = engine.step([StepRow(seq_id, [5 + i, 6, 7]) for i, seq_id in enumerate(decodes)])
    engine.add_sequence("p")
    calls: list[tuple[int, ...]] = []
    sdpa = paged_attention.F.scaled_dot_product_attention

    def recording(query, *args, **kwargs):
        calls.append(tuple(query.shape))
        return sdpa(query, *args, **kwargs)

    monkeypatch.setattr(paged_attention.F, "scaled_dot_product_attention", recording)
    rows = [StepRow("p", list(range(10, 110)))] + [StepRow(s, [t]) for s, t in zip(decodes, first.sampled.tolist())]
    engine.step(rows)
    layers, heads = engine.model.config.num_hidden_layers, engine.model.config.num_attention_heads
    head_dim = calls[0][-1]
    assert len(calls) == 2 * layers
    assert sorted(set(calls)) == [(1, heads, 100, head_dim), (7, heads, 1, head_dim)]
