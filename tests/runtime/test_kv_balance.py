"""Invariant 2: after any mix of finish, cancel and error on both models, both KV pools are back
to zero used blocks and no subserver holds a request (no pending entry left behind)."""

from __future__ import annotations

import random
import time
from typing import Sequence

import pytest

from tokenrouter.policies.base import RequestView, StepResult, register_policy, registered_policies
from tokenrouter.policies.simple import RandomRouting
from tokenrouter.runtime.api import TokenRouter


class FaultyRouting(RandomRouting):
    """Random routing that fails on chosen requests: it raises on the small model for seeds = 1 mod 5,
    raises on the large model for seeds = 2 mod 5, and routes to a model that does not exist for
    seeds = 3 mod 5, each once the request has a few output tokens."""

    name = "test_faulty"

    def route(self, batch: Sequence[RequestView], out: StepResult) -> list[str]:
        destinations = super().route(batch, out)
        for i, request in enumerate(batch):
            if request.num_generated < 3:
                continue
            kind = request.spec.seed % 5
            if (kind == 1 and request.model == self.small) or (kind == 2 and request.model == self.large):
                raise RuntimeError(f"injected failure for seed {request.spec.seed}")
            if kind == 3:
                destinations[i] = "nowhere"
        return destinations


if "test_faulty" not in registered_policies():
    register_policy(FaultyRouting)


def _wait_until_idle(engine: TokenRouter, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(engine.kv_blocks_used().values()) and not any(engine.held_requests().values()):
            return
        time.sleep(0.02)


@pytest.mark.parametrize("run", range(3))
def test_pools_return_to_zero_after_finish_cancel_and_error(run, tiny_config, mixed_prompts):
    config = tiny_config("test_faulty", {"rate": 0.4, "seed": run}, llm_b=[1, 2])
    rng = random.Random(run)
    with TokenRouter.from_config(config) as engine:
        prompts = mixed_prompts(24, seed=run)
        handles = [engine.submit(p, max_tokens=rng.randrange(4, 40), seed=i) for i, p in enumerate(prompts)]
        for handle in rng.sample(handles, 8):  # cancel some at random moments, some before admission
            time.sleep(rng.random() * 0.05)
            handle.cancel()
        results = [handle.wait(60) for handle in handles]
        reasons = {r.finish_reason for r in results}
        assert {"cancelled", "error", "length"} <= reasons, reasons
        for seed, result in enumerate(results):
            if result.finish_reason == "error":
                assert seed % 5 in (1, 2, 3)
                assert "injected failure" in result.error or "unknown model 'nowhere'" in result.error
        _wait_until_idle(engine)  # releases to peers are asynchronous
        assert engine.kv_blocks_used() == {"slm": 0, "llm": 0}
        assert engine.held_requests() == {"slm": 0, "llm": 0}
        assert engine.entry.active == 0
        # The server goes on after all that: a fresh request completes normally.
        assert engine.generate([[5, 6, 7]], max_tokens=5, seed=4)[0].finish_reason == "length"
