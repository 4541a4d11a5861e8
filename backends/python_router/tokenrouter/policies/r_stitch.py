"""R-Stitch: route on the normalized entropy of the next-token distribution.

Small -> large when the small model's normalized entropy exceeds ``threshold``; its uncertain
token is dropped and the large model regenerates that position. Large -> small as soon as the
large model's normalized entropy is at or below ``threshold`` (its confident token is kept).
"""

from __future__ import annotations

import math

import torch

from .base import RequestView, StepResult, register_policy
from .deferral import DeferralParams, DeferralPolicy


class RStitchParams(DeferralParams):
    threshold: float = 0.03  # normalized entropy above which a position belongs to the large model


def normalized_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) per row, divided by log(vocab): 0 = certain, 1 = uniform."""
    # entr(p) = -p log p with entr(0) = 0: masked (-inf) logits add nothing instead of NaN.
    entropy = torch.special.entr(torch.softmax(logits.float(), dim=-1)).sum(dim=-1)
    return entropy / math.log(logits.shape[-1])


def row_entropy(out: StepResult, row: int) -> float:
    """Normalized entropy of one row, computed alone (batch-independent; see deferral.py)."""
    return float(normalized_entropy(out.require_logits()[row:row + 1])[0])


@register_policy
class RStitch(DeferralPolicy):
    """params: threshold (0.03)."""

    name = "r_stitch"
    Params = RStitchParams

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.threshold = self.params.threshold

    # Same rule on both models: uncertain positions belong to the large model.
    def defer(self, request: RequestView, out: StepResult, row: int) -> bool:
        return row_entropy(out, row) > self.threshold

    def hand_back(self, request: RequestView, out: StepResult, row: int, large_tokens: int) -> bool:
        return row_entropy(out, row) <= self.threshold
