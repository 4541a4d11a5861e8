"""The thin loop around the core: a loop that dies anyway is observable and fails its requests.

Uses a real Subserver thread with a small in-test engine (no model weights): the property is
about the loop, not about decoding.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from tokenrouter.engine.base import StepResult
from tokenrouter.protocol import RequestSpec
from tokenrouter.runtime.admission import ServerBusy
from tokenrouter.runtime.core import Limits, SubserverCore
from tokenrouter.runtime.strategies import Strategy
from tokenrouter.runtime.subserver import Subserver
from tokenrouter.runtime.transport import InProcessTransport

from helpers.done_sink import DoneSink


class CountingEngine:
    """Samples token 1 for every row; holds no KV beyond a set of sequence ids."""

    vocab_size = 8

    def __init__(self) -> None:
        self.held: set[str] = set()

    def has_sequence(self, rid) -> bool:
        return rid in self.held

    def add_sequence(self, rid) -> None:
        self.held.add(rid)

    def release(self, rid) -> bool:
        had = rid in self.held
        self.held.discard(rid)
        return had

    def step(self, rows, *, return_hidden=False, top_logits=0, return_logits=True) -> StepResult:
        n = len(rows)
        return StepResult(seq_ids=[r.seq_id for r in rows], sampled=torch.ones(n, dtype=torch.long),
                          logits=torch.zeros(n, self.vocab_size), positions=torch.zeros(n, dtype=torch.long))


class Stay:
    name, needs_hidden, top_logits, needs_logits = "stay", False, 0, False

    def route(self, batch, out):
        return [view.model for view in batch]


def entry(engine: CountingEngine, max_queue: int = 64) -> Subserver:
    limits = Limits(max_batch_size=4, max_prefill_tokens=64, max_wait_s=0.01, max_model_len=64, max_active=4,
                    max_queue=max_queue, queue_timeout_s=0, max_bypass=0)
    core = SubserverCore("a", ["a", "b"], "a", Stay(), limits, capacities={"a": (64, 4), "b": (64, 4)})
    transport = InProcessTransport()
    transport.connect("b", lambda message: None)
    return Subserver(core, engine, transport, Strategy())


def test_a_loop_that_dies_is_observable_and_fails_its_requests(monkeypatch):
    """Catches a loop thread that dies silently: clients would wait forever, and the serving
    layer could not tell the model is down."""
    engine = CountingEngine()
    server = entry(engine)
    deaths: list[tuple[str, bool]] = []  # (the thread it ran on, whether the requests had been failed by then)
    server.start(on_death=lambda: deaths.append((threading.current_thread().name, server.died.is_set())))
    try:
        first = DoneSink()
        server.submit("r0", [1, 2], RequestSpec(prompt_len=2, max_tokens=3), first)
        assert first.done.wait(5) and first.finish == "length" and server.alive
        stuck = DoneSink()
        original = server.core.on_step

        def broken(batch, result, now):
            original(batch, result, now)
            raise RuntimeError("a bug in the core")

        monkeypatch.setattr(server.core, "on_step", broken)
        server.submit("r1", [1, 2], RequestSpec(prompt_len=2, max_tokens=50), stuck)
        assert stuck.done.wait(5), "the request of a dead loop never ended"
        assert stuck.finish == "error" and "a bug in the core" in stuck.error
        assert not server.alive and "a bug in the core" in server.failure
        assert server.died.wait(5)
        deadline = time.monotonic() + 5
        while not deaths and time.monotonic() < deadline:
            time.sleep(0.01)
        assert deaths == [("subserver-a", True)]  # where the Triton glue takes the stub down, once
        assert engine.held == set()  # its KV was released
        late = DoneSink()
        with pytest.raises(RuntimeError, match="is down"):
            server.submit("r2", [1], RequestSpec(prompt_len=1, max_tokens=2), late)
    finally:
        server.stop()


def test_the_embedded_engine_reports_whether_its_loops_run(tiny_config):
    from tokenrouter.runtime.api import TokenRouter

    engine = TokenRouter.from_config(tiny_config("slm_only"))
    assert engine.alive
    engine.shutdown()
    assert not engine.alive


def test_a_stopped_loop_is_not_alive_and_ends_requests_in_flight():
    engine = CountingEngine()
    server = entry(engine)
    assert not server.alive  # not started yet
    server.start()
    assert server.alive
    sink = DoneSink()
    server.submit("r0", [1], RequestSpec(prompt_len=1, max_tokens=60), sink)
    server.stop()
    assert not server.alive and sink.done.wait(5) and sink.finish in ("error", "length")
    assert not server.died.is_set()  # a stop is not a death: the stub must not take itself down


def test_the_queue_bound_counts_submissions_the_loop_has_not_taken_yet():
    """Rule: a burst faster than the loop cannot overshoot max_queue: what sits in the inbox counts.
    The loop is not started, so everything stays in the inbox. Catches a bound read from the
    core's queue alone (it is empty here, and every submission would be taken)."""
    server = entry(CountingEngine(), max_queue=2)
    spec = RequestSpec(prompt_len=3, max_tokens=4, end_ids=[0])
    for rid in ("r0", "r1"):
        server.submit(rid, [1, 2, 3], spec, DoneSink())
    with pytest.raises(ServerBusy, match=r"2 requests queued \(max_queue 2\)"):
        server.submit("r2", [1, 2, 3], spec, DoneSink())
    assert server.queued == 2 and server.stats.refused_busy == 1
    server.start()  # the loop takes both in and admits them: the queue has room again
    try:
        for _ in range(200):
            if server.queued == 0:
                break
            threading.Event().wait(0.01)
        server.submit("r2", [1, 2, 3], spec, DoneSink())
    finally:
        server.stop()
