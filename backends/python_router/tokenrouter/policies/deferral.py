"""The shape most token-level algorithms share: the small model decodes; a per-token rule defers a
position to the large model; the large model hands back after a few tokens.

Subclasses say *when* to defer (``defer``) and, if not after ``run_length`` tokens, when the
large model hands back (``hand_back``). Deferral drops the small model's token by default (the
large model regenerates that position); the large model's tokens always travel back.

Signals are computed one row at a time on purpose: a reduction over a [1, V] row and over a
[B, V] batch may add in a different order, and a decision at a threshold must not depend on
which other requests shared the step.
"""

from __future__ import annotations

from typing import Sequence

import torch
from pydantic import Field

from ..protocol import PeerMessage, Route
from .base import PolicyError, PolicyParams, RequestView, RoutingPolicy, StepResult


class DeferralParams(PolicyParams):
    run_length: int = Field(1, ge=1, description="tokens the large model writes before handing back")


class DeferralPolicy(RoutingPolicy):
    """params: run_length (1): tokens the large model writes before handing back (when the
    subclass does not decide that itself)."""

    Params = DeferralParams
    #: whether the small model's token at a deferred position travels (False: regenerated)
    keep_deferred_token: bool = False

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.run_length = self.params.run_length

    def defer(self, request: RequestView, out: StepResult, row: int) -> bool:
        """On the small model: send this position to the large model?"""
        raise NotImplementedError

    def hand_back(self, request: RequestView, out: StepResult, row: int, large_tokens: int) -> bool:
        """On the large model, after it sampled ``out.sampled[row]``, its ``large_tokens``-th token
        of this run: return to the small model?"""
        return large_tokens >= self.run_length

    def route(self, batch: Sequence[RequestView], out: StepResult) -> list[str | Route]:
        decisions: list[str | Route] = []
        for row, request in enumerate(batch):
            if request.model == self.small:
                decisions.append(self.large if self.defer(request, out, row) else self.small)
                continue
            count = request.state.get("large_tokens", 0) + 1
            back = self.hand_back(request, out, row, count)
            decisions.append(Route(self.small if back else self.large, state={"large_tokens": count}))
        return decisions

    def send(self, request: RequestView, peer: str) -> PeerMessage:
        if peer == self.large:
            return request.message_to(peer, keep_sampled=self.keep_deferred_token, state={"large_tokens": 0})
        return request.message_to(peer, keep_sampled=True, state={})


def row_hidden(policy: RoutingPolicy, out: StepResult, row: int, size: int) -> torch.Tensor:
    """The last hidden state of one row as [1, H] float32; a clear error when the engine left it
    out or when its width is not the ``size`` the router was trained for."""
    if out.hidden is None:
        raise PolicyError(f"policy '{policy.name}' needs hidden states but the step returned none")
    if out.hidden.shape[-1] != size:
        raise PolicyError(f"policy '{policy.name}': router trained for hidden size {size}, the model gives "
                          f"{out.hidden.shape[-1]} (weights for another model pair?)")
    return out.hidden[row:row + 1].float().cpu()


def row_topk(out: StepResult, row: int, k: int) -> torch.Tensor:
    """The row's top-k logits as [1, k], sorted descending; from the engine when it gave them."""
    if out.topk_values is not None and out.topk_values.shape[-1] >= k:
        values = out.topk_values[row:row + 1].float().cpu()
        return torch.sort(values, dim=-1, descending=True).values[:, :k]
    return torch.topk(out.require_logits()[row:row + 1].float().cpu(), k, dim=-1).values
