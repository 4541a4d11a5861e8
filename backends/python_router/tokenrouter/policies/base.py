"""The routing policy API, written from the point of view of one request (TokenRouter's three functions).

A policy never touches the scheduler, the KV pool or the transport. After every engine step the
subserver calls ``route`` on the whole batch; for each request routed away it calls ``send`` to
build the message; the receiving subserver calls ``receive`` to decide which tokens to commit.

    route(batch, out)       -> one decision per row: a destination model name (the current model =
                               keep decoding) or a ``Route`` that also sets the request's policy
                               state or replaces the sampled token
    send(request, peer)     -> PeerMessage (``request.message_to(peer, keep_sampled=...)``)
    receive(request, msg)   -> the tokens of ``msg`` to commit (default: all of them)

Requests reach a policy as read-only ``RequestView``s (``tokenrouter.protocol``): a policy changes
nothing behind the runtime's back; what it decides, it returns. The token sampled in this step
(``request.sampled_token``) is not committed yet when ``route`` runs: if the request stays it is
committed; if it leaves, ``send`` decides whether it travels (``keep_sampled``) or is dropped so
the peer regenerates that position.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, ClassVar, Sequence

from pydantic import BaseModel, ConfigDict, ValidationError

from ..engine.base import SamplingParams, StepResult
from ..protocol import PeerMessage, RequestSpec, RequestView, Route


class PolicyError(ValueError):
    """A policy name or parameter that cannot work; the message says what is allowed."""


class PolicyParams(BaseModel):
    """A policy's parameters (``policy.params`` in config). Each policy declares its own subclass;
    unknown names are refused, so a typo fails at config load naming the field."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class RoutingPolicy:
    """Base class: stays on the current model forever. Subclasses override what they need."""

    name: ClassVar[str] = ""
    Params: ClassVar[type[PolicyParams]] = PolicyParams
    #: ask the engine for the last hidden state at every step (router networks need it; an instance may)
    needs_hidden: bool = False
    #: ask the engine for the top-k logits at every step (0 = no; an instance may set its own)
    top_logits: int = 0

    def __init__(self, models: Sequence[str], entry: str, params: dict[str, Any] | None = None,
                 weights: str | Path | None = None) -> None:
        self.models = list(models)
        self.entry = entry
        self.params = self.parse_params(params)
        self.weights = Path(weights) if weights else None
        if entry not in self.models:
            raise PolicyError(f"entry model '{entry}' is not one of {self.models}")

    # A two-model algorithm's pair, by convention: the entry is the small model, the next one the large.
    @property
    def small(self) -> str:
        return self.entry

    @property
    def large(self) -> str:
        return next(m for m in self.models if m != self.entry)

    def index(self, model: str) -> int:
        return self.models.index(model)

    @classmethod
    def parse_params(cls, params: dict[str, Any] | None) -> Any:
        """``params`` checked against the policy's ``Params`` model; PolicyError names each bad field."""
        try:
            return cls.Params.model_validate(dict(params or {}))
        except ValidationError as err:
            problems = "; ".join(f"params.{'.'.join(str(p) for p in e['loc'])}: "
                                 f"{e['msg'].removeprefix('Value error, ')}" for e in err.errors())
            allowed = ", ".join(cls.Params.model_fields) or "none"
            raise PolicyError(f"policy '{cls.name}': {problems} (parameters: {allowed})") from None

    # --- the three functions ------------------------------------------------------------------
    def route(self, batch: Sequence[RequestView], out: StepResult) -> Sequence[str | Route]:
        return [request.model for request in batch]

    def send(self, request: RequestView, peer: str) -> PeerMessage:
        return request.message_to(peer, keep_sampled=True)

    def receive(self, request: RequestView, message: PeerMessage) -> list[int]:
        return list(message.tokens)


_REGISTRY: dict[str, type[RoutingPolicy]] = {}


def register_policy(cls: type[RoutingPolicy]) -> type[RoutingPolicy]:
    """Class decorator: make a policy selectable by ``policy.name`` in config."""
    if not cls.name:
        raise PolicyError(f"{cls.__name__} needs a 'name'")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise PolicyError(f"policy name '{cls.name}' is registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def registered_policies() -> dict[str, type[RoutingPolicy]]:
    from . import builtin  # noqa: F401  (importing registers the shipped policies)

    return dict(_REGISTRY)


def create_policy(name: str, models: Sequence[str], entry: str, params: dict[str, Any] | None = None,
                  weights: str | Path | None = None) -> RoutingPolicy:
    policies = registered_policies()
    if name not in policies:
        raise PolicyError(f"unknown policy '{name}'; allowed: {', '.join(sorted(policies))}")
    return policies[name](models, entry, params, weights)


def sampling_of(spec: RequestSpec) -> SamplingParams:
    """The engine's sampling parameters for a request (a policy that samples uses the same draw)."""
    return SamplingParams.of_request(spec)


def uniform(*key: Any) -> float:
    """A deterministic number in [0, 1) from a key: decisions that do not depend on batching."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64
