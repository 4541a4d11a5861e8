"""Watchers of a subserver's steps, outside the scheduling decisions: benchmark step records and
the online threshold estimator. Attached only by whoever needs them; each is bounded."""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..protocol import PeerMessage
from .effects import Routed

log = logging.getLogger(__name__)

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


class StepObserver:
    """Base: observes nothing. Subclasses override what they need."""

    def on_step(self, server: "Subserver", record: StepRecord, routed: Routed | None) -> None:
        """Called on the loop thread after each engine step; ``routed`` is None when no row
        predicted a token (a chunk of a prefill). Must be quick."""

    def on_estimates(self, message: PeerMessage) -> None:
        """A peer's ``estimates`` message (called on the delivering thread)."""

    def close(self) -> None:
        """The subserver stopped."""


class StepLog(StepObserver):
    """The last ``maxlen`` step records (benchmarks and the overlap/oracle tests read them)."""

    def __init__(self, maxlen: int = 100_000) -> None:
        self.records: deque[StepRecord] = deque(maxlen=maxlen)

    def on_step(self, server: "Subserver", record: StepRecord, routed: Routed | None) -> None:
        self.records.append(record)

    def __iter__(self):
        return iter(list(self.records))

    def __len__(self) -> int:
        return len(self.records)


class ThresholdFeed(StepObserver):
    """Feeds the online B* estimator (``batch_threshold: auto``) with decode-step latencies and
    where each routed row went.

    In one process every subserver feeds the same estimator. Under Triton each subserver runs in
    its own process with its own estimator (``share_every_s``): it sends what it observed of its
    own model to every peer in an ``estimates`` message that often, and takes the peers' rows
    from theirs, so every process solves with every model's latencies and routes.
    """

    def __init__(self, auto: "AutoThresholds", *, share_every_s: float | None = None, owned: bool = False) -> None:
        self.auto = auto
        self.share_every_s = share_every_s
        self.owned = owned  # close the estimator with the subserver
        self._shared_at = float("-inf")

    def on_step(self, server: "Subserver", record: StepRecord, routed: Routed | None) -> None:
        if routed is not None:
            if routed.decode_only:  # the chain models decode steps; a prefill's cost is another thing
                self.auto.observe_step(server.index, len(routed.destinations), record.end - record.start)
            pairs = [(server.models.index(d), c) for d, c in zip(routed.destinations, routed.committed)
                     if d in server.models]
            self.auto.observe_routes(server.index, [d for d, _ in pairs], [c for _, c in pairs])
        if self.share_every_s is not None and record.end - self._shared_at >= self.share_every_s:
            self._shared_at = record.end
            observed = {"model": server.index, "observed": self.auto.export_model(server.index)}
            for peer in server.models:
                if peer != server.name:
                    server.transport.send(peer, [PeerMessage(kind="estimates", rid="", sender=server.name,
                                                             state=observed)])

    def on_estimates(self, message: PeerMessage) -> None:
        try:
            self.auto.import_model(int(message.state["model"]), message.state["observed"])
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            log.warning("ignoring estimates from %s: %s", message.sender, exc)

    def close(self) -> None:
        if self.owned:
            self.auto.close()
