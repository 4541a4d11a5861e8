"""CITER: a small classifier on the SLM's last hidden state judges whether the SLM's token is
good enough; where it is not, the LLM regenerates that one token and hands back.

CITER states its threshold as a confidence τ that the SLM token is acceptable (τ = 0.98 in the
paper); here ``threshold`` is on the deferral probability, so τ = 0.98 reads threshold = 0.02.
"""

from __future__ import annotations

from .base import register_policy
from .learned import LearnedDeferral


@register_policy
class Citer(LearnedDeferral):
    """params: threshold (trained), run_length (1); weights: a ``citer`` router directory."""

    name = "citer"
