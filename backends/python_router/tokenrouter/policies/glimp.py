"""GlimpRouter: judge a whole step by a glimpse at its first token.

The small model writes the first token of every step; when that token's normalized entropy is above
``threshold`` (or its probability below ``min_confidence``), the step is deferred: the small
model's glimpse token is dropped and the large model writes the step, handing back once it
samples a step-ending token (or after ``max_step_tokens``). Steps end at the token ids in
``step_end_ids`` (e.g. the tokenizer's newline tokens); with none configured every token is its
own step and the large model hands back after ``run_length`` tokens (token-level entropy routing).
"""

from __future__ import annotations

import torch
from pydantic import Field

from .base import RequestView, StepResult, register_policy
from .deferral import DeferralParams, DeferralPolicy
from .r_stitch import row_entropy


class GlimpParams(DeferralParams):
    threshold: float = 0.1  # normalized entropy of a step's first token above which the step is deferred
    min_confidence: float = 0.0  # also defer when the first token's probability is below this (0 = off)
    step_end_ids: list[int] = Field(default_factory=list, description="token ids that end a step")
    max_step_tokens: int = Field(256, ge=1)


@register_policy
class GlimpRouter(DeferralPolicy):
    """params: threshold (0.1, normalized entropy), min_confidence (0 = off), step_end_ids ([]),
    max_step_tokens (256), run_length (1; only without step_end_ids)."""

    name = "glimp"
    Params = GlimpParams

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.threshold = self.params.threshold
        self.min_confidence = self.params.min_confidence
        self.max_step_tokens = self.params.max_step_tokens
        self.step_end_ids = frozenset(self.params.step_end_ids)

    def step_start(self, request: RequestView) -> bool:
        """Is the token being sampled the first of a step?"""
        if not self.step_end_ids or request.num_generated == 0:
            return True
        return request.token_ids[-1] in self.step_end_ids

    def defer(self, request: RequestView, out: StepResult, row: int) -> bool:
        if not self.step_start(request):
            return False
        if row_entropy(out, row) > self.threshold:
            return True
        top = float(torch.softmax(out.require_logits()[row].float(), dim=-1).max())
        return top < self.min_confidence

    def hand_back(self, request: RequestView, out: StepResult, row: int, large_tokens: int) -> bool:
        if not self.step_end_ids:
            return super().hand_back(request, out, row, large_tokens)
        ended = int(out.sampled[row]) in self.step_end_ids
        return ended or large_tokens >= self.max_step_tokens
