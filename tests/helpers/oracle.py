"""What the oracle tests share: the policies that need no trained weights, seeded random routers for
those that do, and the checks against the naive reference (runtime/reference.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch

from tokenrouter.config import load_config
from tokenrouter.policies.networks import build_network, save_router
from tokenrouter.protocol import RequestSpec
from tokenrouter.runtime.api import TokenRouter
from tokenrouter.runtime.assembly import build_policy
from tokenrouter.runtime.reference import reference_generate

POLICIES = {
    "slm_only": {},
    "llm_only": {},
    "random": {"rate": 0.3, "seed": 7},
    "random_runs": {"rate": 0.2, "seed": 3, "run_length": 3, "keep_sampled": True},
    "r_stitch": {"threshold": 0.35},
}


def policy_name(key: str) -> str:
    """The registered policy a POLICIES key names (random_runs is random with runs)."""
    return "random" if key.startswith("random") else key


def assert_no_token_fed_twice(engine: TokenRouter, prompts, results) -> None:
    """Each model is fed each context position at most once: pending requests resume by an extend
    of the peer's suffix, never by recomputing the prefix. Request ids follow submission order."""
    context_len = {f"req-{i}": len(prompt) + len(result.token_ids)
                   for i, (prompt, result) in enumerate(zip(prompts, results))}
    for name, server in engine.subservers.items():
        fed = Counter()
        for record in server.step_log:
            for rid, count in record.rows:
                fed[rid] += count
        for rid, count in fed.items():
            assert count <= context_len[rid], f"{name} was fed {count} tokens of {rid}, context {context_len[rid]}"


HEAD = {"kind": "hidden_head", "hidden_size": 64, "width": 32, "depth": 1}
R2R = {"kind": "r2r", "hidden_size": 64, "vocab_size": 4096, "top_k": 16, "d_model": 16, "depth": 1, "expansion": 2}


def write_router(directory: Path, algorithm: str, architecture: dict) -> Path:
    """A seeded random router with a widened output layer, so that scores spread over (0, 1) and
    few land near the threshold (the test is about the runtime, not about routing quality)."""
    torch.manual_seed(0)
    network = build_network(architecture)
    with torch.no_grad():
        last = network.head if algorithm == "r2r" else network.mlp[-1]
        last.weight.mul_(20.0)
        if algorithm == "r2r":
            network.token_embedding.normal_(0.0, 1.0)
    return save_router(directory, network, {"algorithm": algorithm, "architecture": architecture, "threshold": 0.5})


CASES = {
    "citer": ({}, HEAD),
    "co_llm": ({}, HEAD),
    "r2r": ({}, R2R),
    "ensemble": ({"weights": [0.6, 0.4]}, None),
    "glimp": ({"threshold": 0.35, "step_end_ids": list(range(0, 4096, 5))}, None),
    "query_level": ({"mode": "entropy", "threshold": 0.2}, None),  # splits these prompts about 7:5
}


VLLM_MAX_TOKENS = 16


def run_and_compare(config: dict, engines: dict, references, prompts: list[list[int]]) -> list:
    """``config`` on the vLLM engines, its greedy output checked against the reference, request by request;
    afterwards neither engine holds a sequence or a block."""
    for spec in config["models"].values():
        spec.update(engine="vllm", block_size=32)
    with TokenRouter(load_config(config), engines={"slm": engines["small"], "llm": engines["large"]},
                     step_log=100_000) as engine:
        results = engine.generate(prompts, max_tokens=VLLM_MAX_TOKENS, timeout=300)
        end_ids = sorted(engine.engines["slm"].eos_token_ids)
        for prompt, result in zip(prompts, results):
            spec = RequestSpec(prompt_len=len(prompt), max_tokens=VLLM_MAX_TOKENS, end_ids=end_ids)
            tokens, origins, reason = reference_generate(references, build_policy(engine.config), "slm", prompt,
                                                         spec,
                                                         max_model_len=engine.max_model_len)
            assert result.token_ids == tokens, f"prompt {prompt}"
            assert result.models == [engine.config.model_names[o] for o in origins]
            assert result.finish_reason == reason
        assert_no_token_fed_twice(engine, prompts, results)
    for model in engines.values():  # every request ended: nothing held on either model
        assert model.sequence_ids() == [] and model.num_free_blocks == model.num_total_blocks
    return results
