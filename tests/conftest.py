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
