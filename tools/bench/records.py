"""What a benchmark measures: one record per request, and the summary of a run.

Every time is ``time.monotonic()`` (the clock the subservers' step logs use), so token arrivals,
request boundaries and engine steps can be put on one time line.

Definitions (docs/benchmarks.md repeats them):
  throughput      output tokens that arrived inside the measurement window / window length; the
                  N closed-loop clients keep N requests in flight for the whole window
  TTFT            first output token - submission, per request
  latency         finish - submission, per completed request
  per-user speed  output tokens / latency, per completed request
  large share     output tokens written by the large model / all output tokens
  busy            share of the window a model spent inside engine steps
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Iterable, Mapping, Sequence

Prompt = str | list[int]


@dataclass
class RequestRecord:
    """One request as its client saw it. Arrivals are (time, token count) per chunk."""

    client: int = -1
    submitted: float = field(default_factory=time.monotonic)
    arrivals: list[tuple[float, int]] = field(default_factory=list)
    tokens_by_model: Counter = field(default_factory=Counter)
    finished: float | None = None
    finish_reason: str | None = None
    error: str | None = None
    output: Prompt = field(default_factory=list)  # token ids, or text when the target speaks text
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, count: int, models: Iterable[str] = (), at: float | None = None) -> None:
        """``count`` more output tokens arrived (``models``: who wrote each, when known now)."""
        if count <= 0:
            return
        with self._lock:
            self.arrivals.append((time.monotonic() if at is None else at, count))
            self.tokens_by_model.update(models)

    def finish(self, reason: str, output: Prompt, error: str | None = None) -> None:
        self.finished = time.monotonic()
        self.finish_reason, self.output, self.error = reason, output, error

    @property
    def output_tokens(self) -> int:
        return sum(count for _, count in self.arrivals)

    @property
    def complete(self) -> bool:
        """Ran to its natural end (not cut at the window's end, not failed)."""
        return self.finished is not None and self.finish_reason in ("length", "eos", "stop")

    @property
    def ttft(self) -> float | None:
        return self.arrivals[0][0] - self.submitted if self.arrivals else None

    @property
    def latency(self) -> float | None:
        return self.finished - self.submitted if self.finished is not None else None


@dataclass(frozen=True)
class Window:
    start: float
    end: float

    @property
    def length(self) -> float:
        return self.end - self.start

    def contains(self, at: float | None) -> bool:
        """Whether ``at`` falls inside the window (None: it never happened)."""
        return at is not None and self.start <= at < self.end

    def overlap(self, start: float, end: float) -> float:
        return max(0.0, min(end, self.end) - max(start, self.start))


@dataclass
class Summary:
    clients: int
    window_s: float
    output_tokens: int  # tokens that arrived inside the window
    throughput: float  # tokens / s
    finished: int  # requests that ran to their end inside the window
    cut: int  # requests still running when the window closed (cut there)
    ttft_median_s: float | None  # over requests whose first token arrived inside the window
    ttft_p90_s: float | None
    latency_median_s: float | None  # over the finished ones
    latency_p90_s: float | None
    per_user_median_tok_s: float | None
    large_share: float | None  # over every attributed token of the run; None: none attributed
    busy: dict[str, float]  # model -> busy fraction of the window
    errors: int

    def as_dict(self) -> dict:
        return asdict(self)


def summarize(records: Sequence[RequestRecord], window: Window, clients: int, *, large: str,
              steps: Mapping[str, Sequence[tuple[float, float]]] | None = None) -> Summary:
    """The metrics of one run; ``steps`` maps each model to its engine steps as (start, end).

    Latencies come from requests that finished inside the window, TTFTs from first tokens inside
    it: with N clients always busy, both sample the steady state (long requests that straddle a
    short window are under-represented, which the window length bounds).
    """
    tokens = sum(count for r in records for at, count in r.arrivals if window.start <= at < window.end)
    done = [r for r in records if r.complete and window.contains(r.finished)]
    ttfts = [r.ttft for r in records if r.ttft is not None and window.contains(r.arrivals[0][0])]
    latencies = [r.latency for r in done if r.latency is not None]
    speeds = [r.output_tokens / r.latency for r in done if r.latency]
    attributed: Counter = Counter()
    for r in records:
        attributed.update(r.tokens_by_model)
    total = sum(attributed.values())
    busy = {model: sum(window.overlap(start, end) for start, end in spans) / window.length
            for model, spans in (steps or {}).items()}
    return Summary(
        clients=clients, window_s=window.length, output_tokens=tokens, throughput=tokens / window.length,
        finished=len(done), cut=sum(1 for r in records if r.finish_reason == "cancelled"),
        ttft_median_s=_quantile(ttfts, 0.5), ttft_p90_s=_quantile(ttfts, 0.9),
        latency_median_s=_quantile(latencies, 0.5), latency_p90_s=_quantile(latencies, 0.9),
        per_user_median_tok_s=_quantile(speeds, 0.5),
        large_share=attributed[large] / total if total else None,
        busy=busy, errors=sum(1 for r in records if r.finish_reason == "error"),
    )


def _quantile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between the closest ranks (q = 0.5 is the median)."""
    if not values:
        return None
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
