"""R-Stitch: route on the normalized entropy of the next-token distribution.

Small -> large when the small model's normalized entropy exceeds ``threshold``; its uncertain
token is dropped and the large model regenerates that position. Large -> small as soon as the
large model's normalized entropy is at or below ``threshold`` (its confident token is kept).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from .base import RequestView, RoutingPolicy, StepOutput, register_policy


def normalized_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) per row, divided by log(vocab): 0 = certain, 1 = uniform."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    entropy = -(log_probs.exp() * log_probs).sum(dim=-1)
    return entropy / math.log(logits.shape[-1])


@register_policy
class RStitch(RoutingPolicy):
    name = "r_stitch"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.threshold = self.param("threshold", 0.03)

    def route(self, batch: Sequence[RequestView], out: StepOutput) -> list[str]:
        # Same rule on both models: uncertain positions belong to the large model.
        uncertain = (normalized_entropy(out.logits) > self.threshold).tolist()
        return [self.large if high else self.small for high in uncertain]

    def send(self, request: RequestView, peer: str):
        # Leaving the small model: its uncertain token is dropped. Leaving the large one: kept.
        return request.message_to(peer, keep_sampled=request.model != self.small)
