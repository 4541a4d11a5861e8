"""Client output at the entry: one sink per admitted request, and the output count per model."""

from __future__ import annotations

from collections import Counter
from typing import Mapping

from .effects import Emit
from .request import ClientSink


def large_model_share(tokens_by_model: Mapping[int, int], entry_index: int) -> float:
    """The share of output tokens produced by models other than the entry (0 before any output):
    what a client sees per request and the metrics report over all requests."""
    total = sum(tokens_by_model.values())
    others = total - tokens_by_model.get(entry_index, 0)  # a count, so 5 of 12 is exactly 5 / 12
    return others / total if total else 0.0


class ClientOutputs:
    def __init__(self, output_by_model: Counter) -> None:
        """``output_by_model`` counts the output tokens emitted per model index (a stats counter)."""
        self._sinks: dict[str, ClientSink] = {}
        self.output_by_model = output_by_model

    def open(self, rid: str, sink: ClientSink) -> None:
        self._sinks[rid] = sink

    def emit(self, rid: str, tokens: list[int], origins: list[int], reason: str | None = None,
             error: str | None = None, *, logprobs: list[float] | None) -> list[Emit]:
        """The output effect for ``rid``; none once its sink is closed (the client already heard
        the end). The effect that carries a finish reason closes the sink. ``logprobs``: parallel
        to ``tokens`` when the request returns them, else None."""
        sink = self._sinks.get(rid)
        if sink is None:
            return []
        if reason is not None:
            del self._sinks[rid]
        self.output_by_model.update(origins)
        return [Emit(rid, sink, list(tokens), list(origins), reason, error, logprobs)]

    def close(self, rid: str) -> None:
        self._sinks.pop(rid, None)

    def __contains__(self, rid: str) -> bool:
        return rid in self._sinks
