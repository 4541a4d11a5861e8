"""Busy time of a served runtime's engines, read from outside: each subserver counts the seconds its
engine spent in steps (``tokenrouter_busy_seconds_total{model=...}`` on Triton's metrics port), and a
thread here reads that counter a few times a second.

The embedded runtime hands the benchmark each step's (start, end); a served one runs its steps in
Triton's stub processes, so the benchmark rebuilds spans from the counter instead: the busy seconds
that accrued between two reads, as one span ending at the later read (a subserver adds a step's time
when the step ends; the counter itself moves every half second). Busy shares of a window then come
out of the same arithmetic as the embedded ones, exact to about half a second at each end of the window.
"""

from __future__ import annotations

import threading
import time
from typing import Sequence

from . import prometheus
from .targets import Spans

BUSY_COUNTER = "tokenrouter_busy_seconds_total"
READ_INTERVAL_S = 0.25


def busy_by_model(samples: prometheus.Samples) -> dict[str, float]:
    """Busy seconds so far per model label in one scrape."""
    return prometheus.counter_delta({}, samples, BUSY_COUNTER)


def spans_from_reads(reads: Sequence[tuple[float, dict[str, float]]]) -> Spans:
    """Per model, the busy seconds accrued between consecutive reads as one span ending at the later
    read (it may reach back past the earlier read: a step longer than the interval is counted whole)."""
    spans: Spans = {}
    for (_, before), (end, after) in zip(reads, reads[1:]):
        for model, total in after.items():
            grew = total - before.get(model, 0.0)
            spans.setdefault(model, [])
            if grew > 0:
                spans[model].append((end - grew, end))
    return spans


class BusySampler:
    """Reads the busy counters of ``metrics_urls`` (host:port) every ``interval_s`` until closed (none:
    reads nothing, and has no spans)."""

    def __init__(self, metrics_urls: Sequence[str], interval_s: float = READ_INTERVAL_S) -> None:
        self._urls, self._interval_s = list(metrics_urls), interval_s
        self._reads: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="busy-sampler", daemon=True)
        if self._urls:
            self._thread.start()

    def _read(self) -> None:
        busy: dict[str, float] = {}
        for url in self._urls:  # each model is counted by the one server that runs it
            busy.update(busy_by_model(prometheus.scrape(url, timeout_s=self._interval_s * 4)))
        self._reads.append((time.monotonic(), busy))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._read()
            except OSError:
                pass  # a read the server did not answer in time: the next span covers its interval
            self._stop.wait(self._interval_s)

    def spans(self) -> Spans:
        return spans_from_reads(list(self._reads))

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
