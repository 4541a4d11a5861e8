"""Invariant 1 with TensorRT-LLM's sampling inputs: seeded sampling (temperature > 0, top-k, top-p),
repetition/presence/frequency penalties, min_tokens and logit bias, with log probabilities returned.
For every policy, the served runtime's routed output, batched, equals the naive step-by-step
reference token for token, model for model, with the same finish reason, and each token's log
probability is the one the reference computes at the model that sampled it.

The reference (runtime/reference.py) applies the processing with its own token-by-token code over
its own context, so a runtime whose penalties miss tokens another model produced, or whose
min_tokens counts from the wrong place, differs from it.
"""

from __future__ import annotations

import math

import pytest

from helpers.oracle import CASES, POLICIES, policy_name, write_router
from tokenrouter.protocol import RequestSpec
from tokenrouter.runtime.api import RequestHandle, TokenRouter
from tokenrouter.runtime.assembly import build_policy
from tokenrouter.runtime.reference import reference_generate

MAX_TOKENS = 16
VOCAB = 4096  # the tiny pair's
# Many end ids, so that requests do end by one, and min_tokens has something to hold back.
END_IDS = list(range(0, VOCAB, 16))
SAMPLING = {
    "temperature": 0.9, "top_k": 200, "top_p": 0.95,
    "repetition_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.4,
    "min_tokens": 5,
    # Towards a few tokens of the prompts' range (so they recur and the penalties bite), one banned.
    "logit_bias": [(7, 1.5), (8, 2.0), (9, 2.0), (10, float("-inf")), (7, 0.5)],
}
ALL_POLICIES = {**{key: (POLICIES[key], None) for key in POLICIES}, **CASES}


@pytest.mark.parametrize("key", list(ALL_POLICIES))
def test_sampled_processed_output_equals_naive_reference(key, tiny_config, mixed_prompts, references, tmp_path):
    params, architecture = ALL_POLICIES[key]
    name = policy_name(key) if key in POLICIES else key
    config = tiny_config(name, params, slm_b=1, llm_b=[1, 2])
    if architecture is not None:
        config["policy"]["weights"] = str(write_router(tmp_path / name, name, architecture))
    prompts = mixed_prompts(10, seed=9)
    specs = [RequestSpec(prompt_len=len(prompt), max_tokens=MAX_TOKENS, seed=seed, end_ids=END_IDS,
                         return_log_probs=True, **SAMPLING) for prompt, seed in zip(prompts, range(100, 200))]
    with TokenRouter.from_config(config) as engine:
        # Through the entry, as the api does, but with END_IDS (the api takes the model's eos ids).
        handles = [RequestHandle(f"oracle-{i}", engine) for i in range(len(prompts))]
        for handle, prompt, spec in zip(handles, prompts, specs):
            engine.entry.submit(handle.rid, list(prompt), spec, handle)
        results = [handle.wait(120) for handle in handles]
        reasons = set()
        for prompt, spec, result in zip(prompts, specs, results):
            logprobs: list[float] = []
            tokens, origins, reason = reference_generate(references, build_policy(engine.config), "slm", prompt,
                                                         spec, max_model_len=engine.max_model_len, log_probs=logprobs)
            assert result.token_ids == tokens, f"prompt {prompt}"
            assert result.models == [engine.config.model_names[o] for o in origins]
            assert result.finish_reason == reason
            assert len(result.logprobs) == len(tokens)
            assert all(math.isclose(a, b, abs_tol=1e-3) for a, b in zip(result.logprobs, logprobs)), \
                f"{result.logprobs} != {logprobs}"
            assert all(lp <= 0 for lp in logprobs) and any(lp < 0 for lp in logprobs)
            assert 10 not in tokens, "the banned token was sampled"
            reasons.add(reason)
            if reason == "eos":
                assert len(tokens) > SAMPLING["min_tokens"]
        assert "eos" in reasons, "no request ended by an end id: min_tokens was not exercised"
        if key != "slm_only":
            assert any(r.large_model_share > 0 for r in results), "the policy never routed"

