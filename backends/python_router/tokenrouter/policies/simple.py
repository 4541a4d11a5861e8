"""Baselines: one model only, and a seeded random router."""

from __future__ import annotations

from typing import Sequence

from pydantic import Field

from .base import RequestView, RoutingPolicy, StepResult, register_policy, uniform
from .deferral import DeferralParams, DeferralPolicy


class RandomParams(DeferralParams):
    rate: float = Field(0.1, ge=0.0, le=1.0, description="probability that a position goes to the large model")
    seed: int = 0
    keep_sampled: bool = False  # the small model's drafted token travels (else the large model regenerates it)


@register_policy
class SlmOnly(RoutingPolicy):
    """Every token from the entry (small) model."""

    name = "slm_only"
    needs_logits = False


@register_policy
class LlmOnly(RoutingPolicy):
    """Every token from the large model: the entry prefills nothing useful and hands over at once.

    The entry's first sampled token is dropped, so the large model writes the whole response.
    """

    name = "llm_only"
    needs_logits = False

    def route(self, batch: Sequence[RequestView], out: StepResult) -> list[str]:
        return [self.large for _ in batch]

    def send(self, request: RequestView, peer: str):
        return request.message_to(peer, keep_sampled=False)


@register_policy
class RandomRouting(DeferralPolicy):
    """Send a token to the large model with probability ``rate``; it returns after ``run_length`` tokens.

    The decision for a position depends only on (policy seed, request seed, position), so batching
    and scheduling never change the routed output.
    params: rate (0.1), seed (0), run_length (1), keep_sampled (false: the large model regenerates
    the position the small model drafted).
    """

    name = "random"
    Params = RandomParams
    needs_logits = False

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rate = self.params.rate
        self.seed = self.params.seed
        self.keep_deferred_token = self.params.keep_sampled

    def defer(self, request: RequestView, out: StepResult, row: int) -> bool:
        return uniform("random-policy", self.seed, request.spec.seed, len(request.token_ids)) < self.rate
