"""The routers `tokenrouter train-router` wrote for the real Qwen2.5-Coder pair load through the
model repository (as the Triton backend reads it) and route a real generation.

Slow: needs the real pair (`tokenrouter models pull`) and the trained routers in
model_repository/routing_policy/1/<algo>/ (`tokenrouter train-router`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenrouter.config import load_config
from tokenrouter.runtime.api import TokenRouter
from tokenrouter.runtime.assembly import build_policy
from tokenrouter.serving.repository import read_repository, render_repository

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "qwen2.5-coder.yaml"
ROUTERS = REPO / "model_repository" / "routing_policy" / "1"

pytestmark = pytest.mark.slow


def real_config(algo: str) -> dict:
    weights = ROUTERS / algo
    if not (weights / "model.safetensors").is_file():
        pytest.skip(f"no trained {algo} router in {weights}: run `tokenrouter train-router`")
    config = load_config(CONFIG).model_dump()
    if not all(Path(spec["path"]).is_dir() for spec in config["models"].values()):
        pytest.skip("the real pair is not installed: run `tokenrouter models pull`")
    for spec in config["models"].values():
        spec["kv_cache_tokens"] = 1024  # a short generation; keep memory for the other tests
    config["policy"] = {"name": algo, "params": {}, "weights": str(weights)}
    return config


@pytest.mark.parametrize("algo", ["r2r", "citer", "co_llm"])
def test_router_loads_through_the_model_repository(algo, tmp_path):
    config = real_config(algo)
    served = read_repository(render_repository(config, tmp_path / "repo"))
    policy = build_policy(served)
    assert Path(served.policy.weights) == (tmp_path / "repo" / "routing_policy" / "1" / algo).resolve()
    assert policy.name == algo and policy.router.hidden_size == 896


def test_r2r_routes_a_real_generation():
    config = real_config("r2r")
    with TokenRouter.from_config(config) as engine:
        [result] = engine.generate(["Write a Python function that returns the n-th Fibonacci number."],
                                   max_tokens=24, timeout=600)
    assert result.finish_reason in ("length", "eos", "stop") and len(result.token_ids) > 0
    assert set(result.models) <= {"slm", "llm"}
    print(f"r2r: large-model share {result.large_model_share:.2f}: {result.text!r}")
