"""What a step sends back when the policy does not read the full-vocabulary logits
(``return_logits=False``): the same tokens, top-k and hidden states, no logits, unless a row's own
sampling reads the whole row. Held on the simulated engine (every engine shares ``sampled_result``)
and on rank 0's capture (``vllm_capture.StepCapture``), which vLLM's tensor-parallel engine uses;
tests/runtime/test_tensor_parallel_vllm.py holds the same on a real TP-2 engine."""

from __future__ import annotations

import pytest
import torch

from tokenrouter.config import ModelSpec
from tokenrouter.engine.base import SamplingParams, StepRow, full_logits_needed
from tokenrouter.engine.simulated import SimulatedEngine
from tokenrouter.engine.vllm_capture import StepCapture

RANDOM = SamplingParams(temperature=0.8, seed=3)
PENALTY = SamplingParams(repetition_penalty=1.3)


def simulated() -> SimulatedEngine:
    spec = ModelSpec(engine="simulated", profile={"base": "tiny-cpu-small", "time_scale": 0.0}, block_size=4,
                     kv_cache_tokens=256)
    return SimulatedEngine.from_spec("slm", spec)


@pytest.mark.parametrize("sampling,full", [(SamplingParams(), False), (RANDOM, True), (PENALTY, True)])
def test_a_step_without_logits_gives_the_same_signals(sampling, full):
    """Two engines, the same rows (prefill, then decodes): one asked for the logits, one not."""
    engines = [simulated(), simulated()]
    feeds = {"a": [5, 9, 11], "b": [7]}
    for engine in engines:
        for seq_id in feeds:
            engine.add_sequence(seq_id)
    for _ in range(4):
        rows = [StepRow(seq_id, new, sampling if seq_id == "a" else SamplingParams()) for seq_id, new in feeds.items()]
        asked, reduced = (engine.step(rows, return_hidden=True, top_logits=5, return_logits=want)
                          for engine, want in zip(engines, (True, False)))
        assert asked.logits is not None
        # A row whose sampling reads the whole row brings the whole batch's logits back.
        assert (reduced.logits is not None) == full == full_logits_needed(rows, False)
        assert reduced.sampled.tolist() == asked.sampled.tolist()
        assert reduced.positions.tolist() == asked.positions.tolist()
        torch.testing.assert_close(reduced.hidden, asked.hidden)
        torch.testing.assert_close(reduced.topk_values, asked.topk_values)
        assert reduced.topk_indices.tolist() == asked.topk_indices.tolist()
        feeds = {seq_id: [token] for seq_id, token in zip(asked.seq_ids, asked.sampled.tolist())}


def test_rank0_sends_the_argmax_and_topk_of_the_rows_asked_for_in_their_order():
    generator = torch.Generator().manual_seed(0)
    logits, hidden = torch.randn(3, 1000, generator=generator), torch.randn(3, 16, generator=generator)
    capture = StepCapture(["x", "y", "z"], logits, hidden)
    order = [2, 0]
    reduced = capture.rows(["z", "x"], full=False, top_k=4, hidden=True, to_cpu=True)
    assert reduced["logits"] is None
    assert reduced["argmax"].tolist() == logits[order].argmax(dim=-1).tolist()
    top = torch.topk(logits[order], 4, dim=-1)
    torch.testing.assert_close(reduced["topk_values"], top.values)
    assert reduced["topk_indices"].tolist() == top.indices.tolist()
    torch.testing.assert_close(reduced["hidden"], hidden[order])
    full = capture.rows(["y"], full=True, top_k=0, hidden=False, to_cpu=True)
    torch.testing.assert_close(full["logits"], logits[[1]])
    assert full["hidden"] is None and full["topk_values"] is None and full["argmax"] is None
    with pytest.raises(RuntimeError, match="did not run"):
        capture.rows(["w"], full=False, top_k=0, hidden=False, to_cpu=True)
