"""Shared fixtures: tiny model pairs built once per machine (see engines/tiny.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from tokenrouter_engines.tiny import FAMILIES, ensure_tiny_pair


@pytest.fixture(scope="session")
def tiny_pair_factory() -> Callable[..., dict[str, Path]]:
    """``factory(family="qwen3", seed=0) -> {"small": dir, "large": dir}``, cached on disk."""
    return ensure_tiny_pair


@pytest.fixture(scope="session")
def tiny_pair() -> dict[str, Path]:
    """The default tiny pair (qwen3, seed 0)."""
    return ensure_tiny_pair("qwen3", 0)


@pytest.fixture(scope="session", params=FAMILIES)
def tiny_pair_family(request: pytest.FixtureRequest) -> tuple[str, dict[str, Path]]:
    """Each supported family's tiny pair in turn: (family, paths)."""
    return request.param, ensure_tiny_pair(request.param, 0)


@pytest.fixture(scope="session")
def vllm_tiny_engines(tiny_pair: dict[Path, Path]):
    """The default tiny pair on the vLLM engine, one process per model (started together, ~30 s),
    shared by the whole session: tests release what they add. {"small": engine, "large": engine}."""
    from concurrent.futures import ThreadPoolExecutor

    from tokenrouter.config import ModelSpec
    from tokenrouter.engine.factory import create_engine

    def start(size: str):
        # float32: the oracle tests compare these engines with transformers in float32
        spec = ModelSpec(path=str(tiny_pair[size]), engine="vllm", dtype="float32", kv_cache_tokens=8192, threads=1)
        return create_engine(size, spec)

    with ThreadPoolExecutor(2) as pool:
        engines = dict(zip(("small", "large"), pool.map(start, ("small", "large"))))
    yield engines
    for engine in engines.values():
        engine.close()
