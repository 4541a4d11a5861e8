"""Deferral on a trained router network (CITER, R2R, Co-LLM share this; each says what it feeds).

The router comes from the policy's ``weights`` directory (written by ``tokenrouter train-router``);
the threshold is the one training picked for its target recall unless params override it.
A position goes to the large model when sigmoid(router logit) >= threshold.
"""

from __future__ import annotations

import torch

from .base import RequestView, StepResult
from .deferral import DeferralParams, DeferralPolicy, row_hidden
from .networks import load_router


class LearnedParams(DeferralParams):
    threshold: float | None = None  # None: the threshold training picked (in the router's metadata)


class LearnedDeferral(DeferralPolicy):
    """params: threshold (from the router's metadata), run_length (1)."""

    needs_hidden = True
    needs_logits = False  # the hidden state (and R2R's top-k, which the engine sends)
    Params = LearnedParams

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.router = load_router(self.weights, self.name)
        self.threshold = self.router.threshold if self.params.threshold is None else self.params.threshold

    def logit(self, hidden: torch.Tensor, out: StepResult, row: int) -> torch.Tensor:
        """The router's logit for one row, given its hidden state [1, H]. Default: a hidden-state head."""
        return self.router.network(hidden)

    @torch.inference_mode()
    def score(self, out: StepResult, row: int) -> float:
        """Probability that this position belongs to the large model."""
        hidden = row_hidden(self, out, row, self.router.hidden_size)
        return float(torch.sigmoid(self.logit(hidden, out, row))[0])

    def defer(self, request: RequestView, out: StepResult, row: int) -> bool:
        return self.score(out, row) >= self.threshold
