"""Fixtures for runtime tests: the tiny qwen3 pair as real engines, and the naive reference."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoModelForCausalLM

from tokenrouter.runtime.reference import FullRecompute, hf_full_recompute


def _tiny_config(pair: dict[str, Path], policy: str = "slm_only", params: dict[str, Any] | None = None, *,
                strategy: str = "tokenrouter", slm_b: Any = 1, llm_b: Any = 1, max_active: int = 16,
                max_wait_ms: float = 20.0, kv_tokens: int = 8192, **extra: Any) -> dict[str, Any]:
    return {
        "models": {
            "slm": {"path": str(pair["small"]), "kv_cache_tokens": kv_tokens, "block_size": 8,
                    "batch_threshold": slm_b},
            "llm": {"path": str(pair["large"]), "kv_cache_tokens": kv_tokens, "block_size": 8,
                    "batch_threshold": llm_b},
        },
        "policy": {"name": policy, "params": params or {}},
        "scheduling": {"strategy": strategy, "max_active": max_active, "max_wait_ms": max_wait_ms},
        **extra,
    }


def _mixed_prompts(count: int, seed: int = 0, vocab: int = 1000) -> list[list[int]]:
    """Token-id prompts of mixed lengths (1..40), avoiding special ids at the top of the vocab."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randrange(1, 41))] for _ in range(count)]


@pytest.fixture(scope="session")
def references(tiny_pair: dict[str, Path]) -> dict[str, FullRecompute]:
    """Full-recompute forwards of the tiny pair, for the naive reference."""
    return {name: hf_full_recompute(AutoModelForCausalLM.from_pretrained(str(tiny_pair[size])).eval())
            for name, size in (("slm", "small"), ("llm", "large"))}


@pytest.fixture(scope="session")
def tiny_config(tiny_pair: dict[str, Path]):
    """``tiny_config(policy, params, strategy=..., slm_b=..., llm_b=..., ...)`` -> config dict."""
    return lambda *args, **kwargs: _tiny_config(tiny_pair, *args, **kwargs)


@pytest.fixture(scope="session")
def mixed_prompts():
    return _mixed_prompts
