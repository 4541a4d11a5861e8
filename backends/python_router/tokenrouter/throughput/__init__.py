"""Delayed-batching throughput model (TokenRouter Appendix D) and online threshold selection."""

from .inputs import Grid
from .model import CoarseGridWarning, Prediction, best_thresholds, feasible_thresholds, predict, solve

__all__ = ["CoarseGridWarning", "Grid", "Prediction", "best_thresholds", "feasible_thresholds", "predict", "solve"]
