"""Baselines: one model only, and a seeded random router."""

from __future__ import annotations

from typing import Sequence

from .base import RequestView, RoutingPolicy, StepOutput, register_policy, uniform


@register_policy
class SlmOnly(RoutingPolicy):
    """Every token from the entry (small) model."""

    name = "slm_only"


@register_policy
class LlmOnly(RoutingPolicy):
    """Every token from the large model: the entry prefills nothing useful and hands over at once.

    The entry's first sampled token is dropped, so the large model writes the whole response.
    """

    name = "llm_only"

    def route(self, batch: Sequence[RequestView], out: StepOutput) -> list[str]:
        return [self.large for _ in batch]

    def send(self, request: RequestView, peer: str):
        return request.message_to(peer, keep_sampled=False)


@register_policy
class RandomRouting(RoutingPolicy):
    """Send a token to the large model with probability ``rate``; it returns after ``run_length`` tokens.

    The decision for a position depends only on (policy seed, request seed, position), so batching
    and scheduling never change the routed output.
    params: rate (0.1), seed (0), run_length (1), keep_sampled (false: the large model regenerates
    the position the small model drafted).
    """

    name = "random"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rate = self.param("rate", 0.1)
        self.seed = self.param("seed", 0, int)
        self.run_length = self.param("run_length", 1, int)
        self.keep_sampled = bool(self.params.get("keep_sampled", False))
        if not 0.0 <= self.rate <= 1.0 or self.run_length < 1:
            raise ValueError(f"policy 'random': need 0 <= rate <= 1 and run_length >= 1, got {self.params}")

    def route(self, batch: Sequence[RequestView], out: StepOutput) -> list[str]:
        destinations = []
        for request in batch:
            if request.model == self.small:
                position = len(request.token_ids)
                draw = uniform("random-policy", self.seed, request.spec.seed, position)
                destinations.append(self.large if draw < self.rate else self.small)
            else:
                done = request.state.get("large_tokens", 0) + 1
                request.state["large_tokens"] = done
                destinations.append(self.small if done >= self.run_length else self.large)
        return destinations

    def send(self, request: RequestView, peer: str):
        if peer == self.large:
            return request.message_to(peer, keep_sampled=self.keep_sampled, state={"large_tokens": 0})
        return request.message_to(peer, keep_sampled=True, state={})
