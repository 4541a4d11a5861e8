"""The systems a benchmark compares, each built on the same engines.

  llm_only      the large model alone (entry = large, no routing)
  slm_only      the small model alone
  std_serving   plain serving engine per model + external one-token-per-call dispatcher (stdserving.py)
  r2r_lockstep  official-R2R style: static batches, models in lockstep (Step-Sync), no continuous batching
  step_sync     barrier after every step of all models
  model_sync    one model computes at a time
  eager_async   asynchronous subservers, a model steps as soon as anything is runnable (B = 1)
  tokenrouter   asynchronous subservers + delayed batching, B* from the throughput model per N

Every routing system uses the setup's random policy with the same rate and seed.
"""

from __future__ import annotations

from typing import Any

from tokenrouter.config import STRATEGIES, load_config
from tokenrouter.engine.base import Engine
from tokenrouter.policies.base import create_policy
from tokenrouter.runtime.api import TokenRouter
from tokenrouter.text import TextCodec

from .setups import LARGE, SMALL, Setup
from .stdserving import StdServingTarget
from .targets import STEP_LOG, EmbeddedTarget, Target
from .thresholds import step_latencies, thresholds_by_n

# The baselines, then every scheduling strategy as a system of its own name (tokenrouter last).
SYSTEMS = ("llm_only", "slm_only", "std_serving", "r2r_lockstep", *reversed(STRATEGIES))
STRATEGY = {"r2r_lockstep": "step_sync", "llm_only": "eager_async", "slm_only": "eager_async",
            **{name: name for name in STRATEGIES}}


def is_lockstep(system: str) -> bool:
    """Whether the load generator must send static batches."""
    return system == "r2r_lockstep"


def routing_policy(setup: Setup) -> dict[str, Any]:
    return {"name": "random", "params": {"rate": setup.rate, "seed": 0}}


def system_config(setup: Setup, system: str, clients: int, thresholds: list[list[int]] | None = None) -> dict:
    """The TokenRouterConfig (as a dict) that runs ``system`` on the embedded runtime."""
    if system not in STRATEGY:
        raise ValueError(f"'{system}' is not a runtime system; allowed: {', '.join(STRATEGY)}")
    models = {name: dict(spec) for name, spec in setup.models.items()}
    if system == "tokenrouter" and thresholds is not None:
        for name, by_n in zip((SMALL, LARGE), thresholds):
            models[name]["batch_threshold"] = by_n
    policy = {"name": "slm_only"} if system in ("llm_only", "slm_only") else routing_policy(setup)
    return {
        "models": models,
        "entry": LARGE if system == "llm_only" else SMALL,  # LLM-only: the large model alone, never routed
        "policy": policy,
        "scheduling": {"strategy": STRATEGY[system], "max_active": clients, "max_wait_ms": setup.max_wait_ms},
        "tokenizer": setup.tokenizer,
        "max_model_len": setup.max_model_len,
    }


class SystemFactory:
    """Opens a fresh target per (system, concurrency) on one set of engines."""

    def __init__(self, setup: Setup, engines: dict[str, Engine], codec: TextCodec | None) -> None:
        self.setup, self.engines, self.codec = setup, engines, codec
        self._latencies: list[list[float]] | None = None

    def thresholds(self, clients: int) -> list[list[int]]:
        """B* per model for N = 1..clients from the throughput model."""
        if self._latencies is None or len(self._latencies[0]) < clients:
            self._latencies = [step_latencies(self.engines[name], clients) for name in (SMALL, LARGE)]
        return thresholds_by_n(self.setup.rate, self._latencies, clients)

    def open(self, system: str, clients: int, thresholds: list[list[int]] | None = None) -> Target:
        """A target for ``system``; TokenRouter takes ``thresholds`` (per model, per N) when given,
        else B* from the throughput model."""
        if system == "std_serving":
            spec = self.setup.models[SMALL]
            policy = create_policy("random", [SMALL, LARGE], SMALL, routing_policy(self.setup)["params"])
            return StdServingTarget(self.engines, policy, large=LARGE, max_model_len=self.setup.max_model_len,
                                    max_batch_size=spec.get("max_batch_size", 16),
                                    max_prefill_tokens=spec.get("max_prefill_tokens", 4096), codec=self.codec)
        if system == "tokenrouter" and thresholds is None:
            thresholds = self.thresholds(clients)
        config = load_config(system_config(self.setup, system, clients, thresholds))
        return EmbeddedTarget(TokenRouter(config, engines=self.engines, codec=self.codec, step_log=STEP_LOG), LARGE)
