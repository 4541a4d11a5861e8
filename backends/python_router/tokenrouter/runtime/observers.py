"""Watchers of a subserver's steps, outside the scheduling decisions: benchmark step records and
the online threshold estimator. Attached only by whoever needs them; each is bounded."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .effects import Routed

if TYPE_CHECKING:
    from ..throughput.online import AutoThresholds
    from .subserver import Subserver


@dataclass
class StepRecord:
    start: float
    end: float
    rows: list[tuple[str, int]]  # (request id, tokens fed) per row

    @property
    def batch_size(self) -> int:
        return len(self.rows)


class StepObserver(Protocol):
    def on_step(self, server: "Subserver", record: StepRecord, routed: Routed | None) -> None:
        """Called on the loop thread after each engine step; ``routed`` is None when no row
        predicted a token (a chunk of a prefill). Must be quick and must not raise."""


class StepLog:
    """The last ``maxlen`` step records (benchmarks and the overlap/oracle tests read them)."""

    def __init__(self, maxlen: int = 100_000) -> None:
        self.records: deque[StepRecord] = deque(maxlen=maxlen)

    def on_step(self, server: "Subserver", record: StepRecord, routed: Routed | None) -> None:
        self.records.append(record)

    def __iter__(self):
        return iter(list(self.records))

    def __len__(self) -> int:
        return len(self.records)


class ThresholdFeed:
    """Feeds the online B* estimator (``batch_threshold: auto``) with decode-step latencies and
    where each routed row went."""

    def __init__(self, auto: "AutoThresholds") -> None:
        self.auto = auto

    def on_step(self, server: "Subserver", record: StepRecord, routed: Routed | None) -> None:
        if routed is None:
            return
        if routed.decode_only:  # the chain models decode steps; a prefill's cost is another thing
            self.auto.observe_step(server.index, len(routed.destinations), record.end - record.start)
        pairs = [(server.models.index(d), c) for d, c in zip(routed.destinations, routed.committed) if d in server.models]
        self.auto.observe_routes(server.index, [d for d, _ in pairs], [c for _, c in pairs])
