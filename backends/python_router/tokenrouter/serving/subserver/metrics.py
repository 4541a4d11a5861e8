"""Custom metric families on Triton's metrics port, fed from a subserver's counters.

A background thread turns the subserver's plain counters into Triton metrics twice a second, so
the decoding loop never calls into Triton for metrics.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

from ...runtime.emission import large_model_share
from ...runtime.subserver import Subserver
from .trt_llm_metrics import TrtLlmMetrics

BATCH_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128]
HANDOFF_BUCKETS = [0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05]
QUEUE_WAIT_BUCKETS = [0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60]


class SubserverMetrics:
    def __init__(self, pb_utils: Any, server: Subserver, period_s: float = 0.5,
                 remote_peers: Sequence[str] = ()) -> None:
        """``remote_peers``: the models on other servers of the deployment (a connected gauge each)."""
        family = pb_utils.MetricFamily
        model = {"model": server.name}
        # Triton requires a family to outlive its metrics: keep every family referenced.
        self._families: dict[str, Any] = {}
        families = self._families

        def make(name: str, description: str, kind, labels: dict[str, str] | None = None, **kwargs):
            if name not in families:  # one family per name; label sets tell its metrics apart
                families[name] = family(name=name, description=description, kind=kind)
            return families[name].Metric(labels=labels or model, **kwargs)

        self._server = server
        self._tokens = make("tokenrouter_tokens_total", "Output tokens committed by this model", family.COUNTER)
        self._handoffs_out = make("tokenrouter_handoffs_total", "Requests handed to or received from a peer",
                                  family.COUNTER, {**model, "direction": "out"})
        self._handoffs_in = make("tokenrouter_handoffs_total", "Requests handed to or received from a peer",
                                 family.COUNTER, {**model, "direction": "in"})
        self._pending = make("tokenrouter_pending_requests",
                             "Requests whose KV this model keeps while a peer holds them", family.GAUGE)
        self._running = make("tokenrouter_running_requests", "Requests this model holds and decodes", family.GAUGE)
        self._active = make("tokenrouter_active_requests", "Requests active in the whole router (N)", family.GAUGE)
        self._kv_used = make("tokenrouter_kv_blocks_used", "KV blocks in use in this model's pool", family.GAUGE)
        self._batch = make("tokenrouter_batch_size", "Rows per engine step", family.HISTOGRAM, buckets=BATCH_BUCKETS)
        self._busy = make("tokenrouter_busy_seconds_total", "Time spent in engine steps", family.COUNTER)
        self._handoff_rtt = make("tokenrouter_peer_send_seconds", "Round trip of one peer-message call",
                                 family.HISTOGRAM, buckets=HANDOFF_BUCKETS)
        self._refused_peer_calls = make("tokenrouter_refused_peer_calls_total",
                                        "Calls with a peer_message that lacked this server's secret or the pair "
                                        "secret, or did not fit a link (refused)", family.COUNTER)
        self._connected = {peer: make("tokenrouter_peer_connected", "1 while the peer model on another server is "
                                      "connected, else 0 (the deployment is whole when every one is 1)",
                                      family.GAUGE, {**model, "peer": peer}) for peer in remote_peers}
        self._entry = server.is_entry
        self._counter_kind = family.COUNTER
        if self._entry:
            self._finished_by_reason: dict[str, Any] = {}
            self._make = make
            self._share = make("tokenrouter_large_model_token_share",
                               "Share of output tokens produced by models other than the entry", family.GAUGE)
            self._admission = AdmissionMetrics(make, family, server)
        self._trt_llm = TrtLlmMetrics(pb_utils, server)  # the same state under TensorRT-LLM's names
        self._seen = {"tokens": 0, "out": 0, "in": 0, "busy": 0.0}
        self._seen_batches: Counter = Counter()
        self._seen_finished: Counter = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(period_s,), name="metrics", daemon=True)
        self._thread.start()

    def observe_round_trip(self, seconds: float) -> None:
        self._handoff_rtt.observe(seconds)

    def peer_connected(self, peer: str, connected: bool) -> None:
        self._connected[peer].set(1 if connected else 0)

    def count_refused_peer_call(self) -> None:
        self._refused_peer_calls.increment(1)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def _loop(self, period_s: float) -> None:
        while not self._stop.wait(period_s):
            self.update()

    def update(self) -> None:
        server, stats = self._server, self._server.stats
        self._add(self._tokens, "tokens", stats.tokens_committed)
        self._add(self._handoffs_out, "out", stats.handoffs_out)
        self._add(self._handoffs_in, "in", stats.handoffs_in)
        self._add(self._busy, "busy", stats.busy_s)
        held, running = len(server.requests), len(server.runnable)
        self._pending.set(held - running)
        self._running.set(running)
        self._active.set(server.active)
        self._kv_used.set(server.engine.num_used_blocks)
        self._trt_llm.update()
        for size, count in list(stats.batch_sizes.items()):
            for _ in range(count - self._seen_batches[size]):
                self._batch.observe(size)
            self._seen_batches[size] = count
        if self._entry:
            for reason, count in list(stats.finished.items()):
                if reason not in self._finished_by_reason:
                    self._finished_by_reason[reason] = self._make(
                        "tokenrouter_requests_total", "Finished requests by reason", self._counter_kind,
                        {"model": server.name, "reason": reason})
                self._finished_by_reason[reason].increment(count - self._seen_finished[reason])
                self._seen_finished[reason] = count
            self._admission.update()
            if stats.output_by_model:
                self._share.set(large_model_share(stats.output_by_model, server.index))

    def _add(self, metric: Any, key: str, total: float) -> None:
        delta = total - self._seen[key]
        if delta > 0:
            metric.increment(delta)
            self._seen[key] = total


class AdmissionMetrics:
    """The entry's admission queue: depth, each admitted request's wait, busy refusals, timeouts."""

    def __init__(self, make: Any, family: Any, server: Subserver) -> None:
        self._server = server
        self._depth = make("tokenrouter_queue_depth", "Requests waiting for admission", family.GAUGE)
        self._wait = make("tokenrouter_queue_wait_seconds", "Time each admitted request waited for admission",
                          family.HISTOGRAM, buckets=QUEUE_WAIT_BUCKETS)
        self._refused = make("tokenrouter_refused_busy_total",
                             "Requests refused at once because the admission queue was full (max_queue)",
                             family.COUNTER)
        self._timeouts = make("tokenrouter_queue_timeouts_total",
                              "Requests that ended because they were not admitted within queue_timeout_s",
                              family.COUNTER)
        self._seen = {"refused": 0, "timeouts": 0}

    def update(self) -> None:
        server, stats = self._server, self._server.stats
        self._depth.set(server.queued)
        waits = stats.queue_waits
        while waits:  # the loop appends, this thread pops: both ends of a deque are thread-safe
            self._wait.observe(waits.popleft())
        for key, metric, total in (("refused", self._refused, stats.refused_busy),
                                   ("timeouts", self._timeouts, stats.queue_timeouts)):
            if total > self._seen[key]:
                metric.increment(total - self._seen[key])
                self._seen[key] = total
