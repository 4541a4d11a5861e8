"""`bench step-costs`: the step costs the throughput model takes, recovered from an engine."""

from __future__ import annotations

import pytest

from tokenrouter.engine.simulated import SimulatedEngine
from tokenrouter_tools.bench.step_costs import fit_feed_cost, measure_step_costs, pair_file


def test_the_simulated_profile_is_recovered_exactly() -> None:
    # a100-r2r-32b: 27.5 + 0.4 per row, 0.05 ms per fed token past a row's first, nothing per arrival
    engine = SimulatedEngine("llm", {"base": "a100-r2r-32b", "time_scale": 0})
    free = engine.num_free_blocks
    costs = measure_step_costs(engine, 4, context=64, extends=(1, 5, 33), samples=1)
    assert costs["decode_s"] == pytest.approx([27.9e-3, 28.3e-3, 28.7e-3, 29.1e-3])
    assert costs["per_token_s"] == pytest.approx(5e-5)
    assert costs["arrival_s"] == pytest.approx(0.0, abs=1e-12)
    assert costs["extend_extra_s"]["33"] == pytest.approx(32 * 5e-5)
    assert engine.num_free_blocks == free  # every measured sequence released


def test_fit_of_arrival_and_per_token_cost() -> None:
    assert fit_feed_cost({1: 2.0, 5: 6.0, 9: 10.0}) == pytest.approx((1.0, 2.0))
    assert fit_feed_cost({1: 0.0, 3: -0.5}) == (0.0, pytest.approx(0.0))  # noise below zero is clamped
    with pytest.raises(ValueError, match="two extend sizes"):
        fit_feed_cost({4: 1.0})


def test_pair_file_feeds_the_throughput_command() -> None:
    costs = {m: {"decode_s": [0.01 * (i + 1), 0.012 * (i + 1)], "per_token_s": 1e-4 * (i + 1), "arrival_s": 0.0}
             for i, m in enumerate(("slm", "llm"))}
    out = pair_file(costs, ["slm", "llm"], rate=0.2, N=2, prompt_tokens=(10, 20), output_tokens=8)
    assert out["L_ms"] == [[10.0, 12.0], [20.0, 24.0]]
    assert out["per_token_ms"] == [0.1, 0.2] and out["arrival_ms"] == [0.0, 0.0]
    assert out["P"] == [[0.8, 0.2], [1.0, 0.0]] and out["prompt_tokens"] == [10, 20] and out["output_tokens"] == 8
