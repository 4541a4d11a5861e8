"""Invariant 1 for the policies that test_oracle.py leaves out (trained routers, ensemble,
GlimpRouter, query-level): the served runtime's greedy output, batched, equals the naive
one-request-at-a-time reference token for token, and every policy does route."""

from __future__ import annotations


import pytest

from helpers.oracle import CASES, write_router
from tokenrouter.runtime.api import TokenRouter
from tokenrouter.protocol import RequestSpec
from tokenrouter.runtime.assembly import build_policy
from tokenrouter.runtime.reference import reference_generate

MAX_TOKENS = 16
@pytest.mark.parametrize("name", list(CASES))
def test_routed_output_equals_naive_reference(name, tiny_config, mixed_prompts, references, tmp_path):
    params, architecture = CASES[name]
    config = tiny_config(name, params, slm_b=1, llm_b=[1, 2])
    if architecture is not None:
        config["policy"]["weights"] = str(write_router(tmp_path / name, name, architecture))
    prompts = mixed_prompts(12, seed=5)
    with TokenRouter.from_config(config) as engine:
        results = engine.generate(prompts, max_tokens=MAX_TOKENS, timeout=120)
        end_ids = sorted(engine.engines["slm"].eos_token_ids)
        for prompt, result in zip(prompts, results):
            spec = RequestSpec(prompt_len=len(prompt), max_tokens=MAX_TOKENS, end_ids=end_ids)
            tokens, origins, reason = reference_generate(references, build_policy(engine.config), "slm", prompt, spec,
                                                         max_model_len=engine.max_model_len)
            assert result.token_ids == tokens, f"prompt {prompt}"
            assert result.models == [engine.config.model_names[o] for o in origins]
            assert result.finish_reason == reason
        assert any(result.large_model_share > 0 for result in results), "the policy never routed"
        if name != "ensemble":  # the ensemble's last model (the large one) commits every token
            assert any(result.large_model_share < 1 for result in results), "the policy never stayed"
        if name == "query_level":
            assert all(len(set(result.models)) == 1 for result in results)  # one model per request
