"""Co-LLM: a learned deferral head on the base (small) model's hidden state decides, token by
token, to let the assistant (large) model write the next token (η = 0.15 in the paper).

The head is trained on Co-LLM's pseudo-labels: defer where the large model gives the true next
token a higher probability than the small one does (see ``tokenrouter train-router``).
"""

from __future__ import annotations

from .base import register_policy
from .learned import LearnedDeferral


@register_policy
class CoLlm(LearnedDeferral):
    """params: threshold (trained; the paper's η), run_length (1); weights: a ``co_llm`` router directory."""

    name = "co_llm"
