"""Turn a validated config into subservers. Shared by the embedded API (all models in one process)
and the Triton backend (one model per stub process), so both run the same runtime.

This is the one runtime module that knows the policy registry: it is where a config's names
become objects. The core and the loop see a policy only through ``tokenrouter.protocol.Policy``.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

from ..config import ModelSpec, TokenRouterConfig, fixed_threshold
from ..engine.base import Engine
from ..policies.base import RoutingPolicy, create_policy
from .core import Limits, SubserverCore
from .observers import StepObserver, ThresholdFeed
from .strategies import Strategy, make_strategy
from .subserver import Subserver
from .transport import Transport

ESTIMATES_EVERY_S = 0.5  # how often a subserver alone in its process shares its observations


def build_policy(config: TokenRouterConfig) -> RoutingPolicy:
    return create_policy(config.policy.name, config.model_names, config.entry, config.policy.params,
                         config.policy.weights)


def kv_capacity(spec: ModelSpec) -> tuple[int, int]:
    """(blocks, block size) a model's pool holds, as the engine builds it from its spec."""
    return spec.kv_cache_tokens // spec.block_size, spec.block_size


def threshold_function(config: TokenRouterConfig, name: str, auto=None) -> Callable[[int], int]:
    """B for model ``name`` as a function of the active count N."""
    threshold = config.models[name].batch_threshold
    if not isinstance(threshold, str):  # a str is only ever 'auto'
        return functools.partial(fixed_threshold, threshold)
    if auto is None:
        raise ValueError(f"models.{name}.batch_threshold is 'auto' but no online estimator was given")
    index = config.model_names.index(name)
    return lambda active: auto.thresholds(active)[index]


def effective_max_model_len(config: TokenRouterConfig, engine_limits: list[int]) -> int:
    limits = list(engine_limits) + ([config.max_model_len] if config.max_model_len else [])
    return min(limits)


def build_subserver(config: TokenRouterConfig, name: str, engine: Engine, policy: RoutingPolicy,
                    transport: Transport, strategy: Strategy, *, max_model_len: int, auto=None,
                    capacities: dict[str, tuple[int, int]] | None = None,
                    observers: Sequence[StepObserver] = ()) -> Subserver:
    """``auto``: the online threshold estimator all subservers of this process share; without
    one, a config asking for ``batch_threshold: auto`` gets an estimator per subserver."""
    spec = config.models[name]
    scheduling = config.scheduling
    limits = Limits(max_batch_size=spec.max_batch_size, max_prefill_tokens=spec.max_prefill_tokens,
                    max_wait_s=scheduling.max_wait_ms / 1000, max_model_len=max_model_len,
                    max_active=scheduling.max_active, max_queue=scheduling.max_queue,
                    queue_timeout_s=scheduling.queue_timeout_s, max_bypass=scheduling.max_bypass)
    feeds = []
    if auto is not None:
        feeds.append(ThresholdFeed(auto))
    elif strategy.uses_thresholds and (auto := make_auto_thresholds(config)) is not None:
        # This subserver runs alone in its process (Triton): an estimator of its own, sharing
        # what it observes of its model with the peers' estimators.
        feeds.append(ThresholdFeed(auto, share_every_s=ESTIMATES_EVERY_S, owned=True))
    threshold = threshold_function(config, name, auto) if strategy.uses_thresholds else (lambda active: 1)
    core = SubserverCore(name, config.model_names, config.entry, policy, limits, threshold=threshold,
                         capacities=capacities if name == config.entry else None)
    return Subserver(core, engine, transport, strategy, observers=[*feeds, *observers])


def build_lone_subserver(config: TokenRouterConfig, name: str, engine: Engine, transport: Transport,
                         capacities: dict[str, tuple[int, int]] | None = None) -> Subserver:
    """Model ``name``'s subserver alone in its process (a Triton stub, a Dynamo pool worker): its own
    policy and strategy, the context its engine allows, and the KV the entry admits against
    (``capacities``; default: every model's whole)."""
    return build_subserver(config, name, engine, build_policy(config), transport,
                           make_strategy(config.scheduling.strategy, len(config.models)),
                           max_model_len=effective_max_model_len(config, [engine.max_model_len]),
                           capacities=capacities or {model: kv_capacity(spec) for model, spec in config.models.items()})


def make_auto_thresholds(config: TokenRouterConfig):
    """The online B* estimator when any model asks for 'auto' (and the strategy uses thresholds)."""
    if config.scheduling.strategy != "tokenrouter":
        return None
    if not any(spec.batch_threshold == "auto" for spec in config.models.values()):
        return None
    from ..throughput.online import AutoThresholds

    return AutoThresholds(config.model_names, config.scheduling.max_active)
