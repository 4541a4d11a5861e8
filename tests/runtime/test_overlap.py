"""Invariant 3: a fast model never waits on a slow one's step. Shown from the subservers' recorded
step timestamps (not wall time): under TokenRouter's asynchronous loops the small model completes
steps inside the large model's steps; under Model-Sync (one model at a time) it never does."""

from __future__ import annotations

import pytest

from tokenrouter.runtime.api import TokenRouter


def _small_steps_inside_large_steps(engine: TokenRouter) -> int:
    large = [(r.start, r.end) for r in engine.subservers["llm"].step_log]
    return sum(1 for r in engine.subservers["slm"].step_log
               if any(start < r.start and r.end < end for start, end in large))


@pytest.mark.parametrize("strategy", ["tokenrouter", "model_sync"])
def test_small_model_keeps_stepping_while_large_computes(strategy, tiny_config, mixed_prompts, tiny_pair):
    config = tiny_config("random", {"rate": 0.15, "seed": 1}, strategy=strategy)
    # A ~10x gap in step cost: the large model prefills long contexts one request at a time.
    config["models"]["llm"]["max_batch_size"] = 1
    config["models"]["slm"]["threads"] = config["models"]["llm"]["threads"] = 1
    with TokenRouter.from_config(config, step_log=100_000) as engine:
        prompts = [p * 12 for p in mixed_prompts(8, seed=5)]  # long prompts make large steps slow
        results = engine.generate(prompts, max_tokens=24, timeout=120)
        assert any(r.large_model_share > 0 for r in results)
        large = engine.subservers["llm"].step_log
        small = engine.subservers["slm"].step_log
        large_mean = sum(r.end - r.start for r in large) / len(large)
        small_mean = sum(r.end - r.start for r in small) / len(small)
        inside = _small_steps_inside_large_steps(engine)
    if strategy == "tokenrouter":
        assert large_mean > 2 * small_mean, (large_mean, small_mean)
        assert inside > 0, "the small model never stepped while the large one computed"
    else:
        assert inside == 0, "model_sync let two models compute at once"
