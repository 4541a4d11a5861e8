"""ME, the multi-model ensemble policy (`ensemble` in a config; not the `ensemble` front): a weighted
ensemble of M >= 2 models' next-token distributions, at every token.

Each token visits every model once, in ring order (the entry first, then the others in config
order): each model adds ``weight * softmax(its logits)`` to the request's state and passes it on
without committing; the last model adds its own full distribution, samples the mixture with the
reproducible sampler (log-probabilities in place of logits, so sampling stays a function of
(seed, position)), commits the token and hands back to the first model.

Only the top ``carry_top_k`` entries of each intermediate contribution travel (the state crosses
processes as JSON); the last model's contribution is exact.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..engine.sampling import sample_tokens
from ..protocol import PeerMessage, Route
from pydantic import Field

from .base import PolicyError, PolicyParams, RequestView, RoutingPolicy, StepResult, register_policy, sampling_of

DEFAULT_WEIGHTS = (0.5, 0.3, 0.2)  # the paper's weights over 0.6B/8B/32B, in config order


class MultiModelEnsembleParams(PolicyParams):
    weights: list[float] | dict[str, float] | None = None  # checked against the model list below
    carry_top_k: int = Field(64, ge=1, description="entries of each intermediate contribution that travel")


@register_policy
class MultiModelEnsemble(RoutingPolicy):
    """params: weights (list in config model order, or {model: weight}; default 0.5/0.3/0.2
    truncated to the models and normalized, uniform beyond three), carry_top_k (64)."""

    name = "ensemble"
    Params = MultiModelEnsembleParams

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if len(self.models) < 2:
            raise PolicyError(f"policy 'ensemble' needs at least 2 models, got {self.models}")
        self.ring = [self.entry] + [m for m in self.models if m != self.entry]
        self.weights_by_model = self._weights(self.params.weights)
        self.carry_top_k = self.params.carry_top_k

    def _weights(self, raw: Any) -> dict[str, float]:
        if raw is None:
            raw = list(DEFAULT_WEIGHTS[:len(self.models)]) if len(self.models) <= 3 else [1.0] * len(self.models)
        if isinstance(raw, dict):
            unknown = set(raw) - set(self.models)
            if unknown or len(raw) != len(self.models):
                raise PolicyError(f"policy 'ensemble': weights must name every model of {self.models}, got {raw}")
            raw = [raw[m] for m in self.models]
        if len(raw) != len(self.models):
            raise PolicyError(f"policy 'ensemble': weights need one number per model {self.models}, got {raw!r}")
        values = [float(w) for w in raw]
        if any(w < 0 for w in values) or sum(values) <= 0:
            raise PolicyError(f"policy 'ensemble': weights must be >= 0 with a positive sum, got {values}")
        total = sum(values)
        return {model: w / total for model, w in zip(self.models, values)}

    def contribution(self, model: str, logits: torch.Tensor) -> torch.Tensor:
        """weight * softmax(logits) for one row [V], in float64."""
        return self.weights_by_model[model] * torch.softmax(logits.double(), dim=-1)

    def route(self, batch: Sequence[RequestView], out: StepResult) -> list[Route]:
        decisions = []
        for row, request in enumerate(batch):
            position = self.ring.index(request.model)
            part = self.contribution(request.model, out.require_logits()[row])
            carried = request.state.get("mix") if position > 0 else None
            if position > 0 and carried is None:
                raise PolicyError(f"policy 'ensemble': request {request.rid} reached {request.model} without a mixture")
            if carried is None or position < len(self.ring) - 1:  # (None: the entry, never last in a ring of 2+)
                mix = merge_sparse(carried, part, self.carry_top_k)
                decisions.append(Route(self.ring[position + 1], state={"mix": mix}))
                continue
            mixture = add_sparse(part, carried)
            token = int(sample_tokens(mixture.log()[None], [sampling_of(request.spec)], [int(out.positions[row])])[0])
            decisions.append(Route(self.ring[0], state={}, token=token))
        return decisions

    def send(self, request: RequestView, peer: str) -> PeerMessage:
        # Back to the first model with the sampled mixture token; forward without one.
        if peer == self.ring[0]:
            return request.message_to(peer, keep_sampled=True, state={})
        return request.message_to(peer, keep_sampled=False, state=request.state)


def merge_sparse(carried: dict[str, list] | None, part: torch.Tensor, k: int) -> dict[str, list]:
    """``carried`` (sparse {"ids", "p"}) plus the top-k entries of the dense ``part``, JSON-ready."""
    mix: dict[int, float] = dict(zip(carried["ids"], carried["p"])) if carried else {}
    top = torch.topk(part, min(k, part.numel()))
    for token, p in zip(top.indices.tolist(), top.values.tolist()):
        mix[token] = mix.get(token, 0.0) + p
    ids = sorted(mix)
    return {"ids": ids, "p": [mix[i] for i in ids]}


def add_sparse(dense: torch.Tensor, carried: dict[str, list]) -> torch.Tensor:
    """``dense`` [V] plus the sparse mixture ``carried``."""
    ids = torch.tensor(carried["ids"], dtype=torch.long)
    if ids.numel() and int(ids.max()) >= dense.numel():
        raise PolicyError(f"policy 'ensemble': token id {int(ids.max())} outside the vocabulary ({dense.numel()}); "
                          "the ensembled models must share one tokenizer")
    return dense.index_add(0, ids, torch.tensor(carried["p"], dtype=dense.dtype))
