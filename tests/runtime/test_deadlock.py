"""No deadlock: for N = 1..8 and every allowed threshold vector B, all requests finish; a B that
allows sum(B_i - 1) >= N is rejected when the config is loaded.

The bounded wait is set far beyond the test's timeout, so it cannot hide a deadlock."""

from __future__ import annotations

import itertools

import pytest

from tokenrouter.config import ConfigError, load_config
from tokenrouter.engine.factory import create_engine
from tokenrouter.runtime.api import TokenRouter

MAX_N = 8


@pytest.fixture(scope="module")
def shared_engines(tiny_config):
    config = load_config(tiny_config("random", {"rate": 0.5}))
    engines = {name: create_engine(name, spec) for name, spec in config.models.items()}
    yield engines
    for engine in engines.values():
        engine.close()


def _allowed(n: int):
    return [(b0, b1) for b0, b1 in itertools.product(range(1, n + 1), repeat=2) if (b0 - 1) + (b1 - 1) < n]


@pytest.mark.parametrize("n", range(1, MAX_N + 1))
def test_every_allowed_threshold_finishes(n, tiny_config, mixed_prompts, shared_engines):
    for b0, b1 in _allowed(n):
        # Thresholds apply at exactly N = n; below that they are 1 so the config is valid for all N' <= n.
        config = tiny_config("random", {"rate": 0.5, "seed": n}, slm_b=[1] * (n - 1) + [b0],
                             llm_b=[1] * (n - 1) + [b1], max_active=n, max_wait_ms=600_000)
        with TokenRouter(load_config(config), engines=shared_engines) as engine:
            handles = [engine.submit(p, max_tokens=6, seed=i) for i, p in enumerate(mixed_prompts(n, seed=n))]
            for handle in handles:
                result = handle.wait(timeout=30)  # raises TimeoutError on a deadlock
                assert result.finish_reason in ("length", "eos"), (n, b0, b1, result)
        assert all(engine.num_used_blocks == 0 for engine in shared_engines.values())


@pytest.mark.parametrize("b_small,b_large,max_active", [(1, 2, 1), (2, 2, 2), (3, 1, 2), ([1, 3], 2, 2)])
def test_deadlocking_thresholds_are_rejected(b_small, b_large, max_active, tiny_config):
    with pytest.raises(ConfigError, match=r"deadlock at N=\d+"):
        load_config(tiny_config(slm_b=b_small, llm_b=b_large, max_active=max_active))
