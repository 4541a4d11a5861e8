"""Unit checks of the sampler's TensorRT-LLM semantics that the oracles do not isolate: top_p 0 as
"unset", the log probability a token reports, the fast path of a batch without processing, and
context counts that die with their sequence."""

from __future__ import annotations

import math

import torch

from tokenrouter.engine.base import SamplingParams, StepRow
from tokenrouter.engine.logit_processing import ContextCounts, process_logits
from tokenrouter.engine.sampling import filter_logits, sample_tokens, sampled_log_prob
from tokenrouter.engine.simulated import SimulatedEngine


def test_top_p_zero_is_unset():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(1))
    positions = [3, 4, 5, 6]
    # With top_k: no nucleus filter, the same draw as top_p 1.
    with_k = [SamplingParams(temperature=0.9, top_p=0.0, top_k=5, seed=s) for s in range(4)]
    plain_k = [SamplingParams(temperature=0.9, top_p=1.0, top_k=5, seed=s) for s in range(4)]
    assert torch.equal(sample_tokens(logits, with_k, positions), sample_tokens(logits, plain_k, positions))
    assert torch.equal(filter_logits(logits[0], with_k[0]), filter_logits(logits[0], plain_k[0]))
    # Without top_k as well: greedy, whatever the temperature.
    greedy = [SamplingParams(temperature=0.9, top_p=0.0, seed=s) for s in range(4)]
    assert torch.equal(sample_tokens(logits, greedy, positions), logits.argmax(-1))


def test_log_prob_is_of_the_distribution_drawn_from():
    logits = torch.randn(50, generator=torch.Generator().manual_seed(2))
    params = SamplingParams(temperature=0.7, top_k=10, seed=3)
    token = int(sample_tokens(logits[None], [params], [9])[0])
    kept = torch.softmax(logits / 0.7, -1).topk(10)
    expected = math.log(kept.values[kept.indices.tolist().index(token)] / kept.values.sum())
    assert math.isclose(sampled_log_prob(logits, params, token), expected, rel_tol=1e-5)
    assert sampled_log_prob(logits, SamplingParams(), int(logits.argmax())) == 0.0  # greedy: top-1


def test_a_batch_without_processing_keeps_its_logits_tensor():
    logits = torch.randn(3, 20)
    rows = [StepRow(i, [1], SamplingParams(temperature=0.5, seed=i)) for i in range(3)]
    assert process_logits(logits, rows, [5, 5, 5], ContextCounts()) is logits


def test_processing_of_one_row_leaves_the_others_alone():
    logits = torch.randn(3, 20)
    counts = ContextCounts()
    rows = [StepRow("a", [1]), StepRow("b", [2, 2, 3], SamplingParams(presence_penalty=1.0, frequency_penalty=0.5,
                                                                       logit_bias=((4, 2.0),))), StepRow("c", [1])]
    counts.record(rows, [1, 3, 1], 20, logits.device)
    out = process_logits(logits, rows, [1, 3, 1], counts)
    assert torch.equal(out[[0, 2]], logits[[0, 2]])
    expected = logits[1].clone()
    expected[4] += 2.0
    expected[2] -= 1.0 + 0.5 * 2
    expected[3] -= 1.0 + 0.5
    assert torch.allclose(out[1], expected)


def test_counts_die_with_their_sequence():
    engine = SimulatedEngine("sim", {"base": "tiny-cpu-small", "time_scale": 0.0}, block_size=4, kv_cache_tokens=256)
    penalized = SamplingParams(repetition_penalty=2.0)
    engine.add_sequence("s")
    engine.step([StepRow("s", [5, 5, 6], penalized)])
    engine.release("s")
    engine.add_sequence("s")
    engine.step([StepRow("s", [7], penalized)])
    assert engine._context_counts.of("s").nonzero().flatten().tolist() == [7]
