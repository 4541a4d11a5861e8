"""Invariant 1 on the vLLM engine: routed greedy output equals the naive full-recompute reference
(transformers forwards) token for token, for every shipped policy and every strategy, with both
models on vLLM (each in its own process). Catches: a wrong chunk on resume (the foreign tokens or
the kept/dropped sampled token), a row's logits taken from another row, a pending request
scheduled or its KV reused, a resume that feeds the whole context again instead of the peer's
suffix (the engine checks that vLLM computed exactly the tokens fed in each step, so the step log
counts what vLLM computed), and any drift between vLLM's forward and transformers'."""

from __future__ import annotations

import pytest

from helpers.oracle import CASES, run_and_compare, write_router

STRATEGIES = [("tokenrouter", 1, [1, 2, 2, 3]), ("eager_async", 1, 1), ("step_sync", 1, 1), ("model_sync", 1, 1)]
BASIC = {"slm_only": {}, "llm_only": {}, "random": {"rate": 0.3, "seed": 7}, "r_stitch": {"threshold": 0.35}}


# A policy that never hands off exercises no strategy: it runs under tokenrouter alone.
BASIC_CASES = [(name, *schedule) for name in BASIC for schedule in STRATEGIES
               if schedule[0] == "tokenrouter" or name not in ("slm_only", "llm_only")]


@pytest.mark.parametrize("name,strategy,slm_b,llm_b", BASIC_CASES, ids=lambda v: str(v))
def test_basic_policies_every_strategy(name, strategy, slm_b, llm_b, tiny_config, mixed_prompts, references,
                                       vllm_tiny_engines):
    config = tiny_config(name, BASIC[name], strategy=strategy, slm_b=slm_b, llm_b=llm_b)
    results = run_and_compare(config, vllm_tiny_engines, references, mixed_prompts(12, seed=2))
    if name in ("random", "r_stitch"):
        assert any(0 < result.large_model_share < 1 for result in results), "no request was routed"


@pytest.mark.parametrize("name", list(CASES))
def test_signal_hungry_policies(name, tiny_config, mixed_prompts, references, vllm_tiny_engines, tmp_path):
    """Learned routers read hidden states, the ensemble full logits, GlimpRouter and query-level
    entropies: every signal the vLLM engine captures."""
    params, architecture = CASES[name]
    config = tiny_config(name, params, slm_b=1, llm_b=[1, 2])
    if architecture is not None:
        config["policy"]["weights"] = str(write_router(tmp_path / name, name, architecture))
    results = run_and_compare(config, vllm_tiny_engines, references, mixed_prompts(10, seed=5))
    assert any(result.large_model_share > 0 for result in results), "the policy never routed"
