"""The launcher's drain (launch/server_control.py, ServerControl.drain), without Triton: it is over only
when every front answered its drain call with "none in flight" and the entry held no request for
IDLE_S; a call that fails, is refused or stalls says nothing, so the drain goes on to its deadline
and reports False (the caller then ends the requests with the shutdown message). It once took an
unreadable repository index for "every front unloaded" and ended at once, cutting the requests in
flight without that message."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from tokenrouter.launch import server_control
from tokenrouter.launch.server_control import IDLE_S, ServerControl

FRONTS = ["tokenrouter", "ensemble"]


class Calls:
    """Stands in for the server's control calls and metrics; records the drain calls."""

    def __init__(self, busy_calls: int = 0, held: list[float | None] | None = None, taken: bool = True,
                 stall_s: float = 0.0) -> None:
        self.busy_calls, self.held, self.taken, self.stall_s = busy_calls, held or [0.0], taken, stall_s
        self.drains: list[tuple[str, str, str]] = []

    def control(self, model: str, command: str, reason: str) -> bool:
        time.sleep(self.stall_s)
        self.drains.append((model, command, reason))
        self.busy_calls -= 1
        return self.taken and self.busy_calls < 0

    def requests_held(self, entry: str) -> float | None:
        return self.held.pop(0) if len(self.held) > 1 else self.held[0]


def server(monkeypatch: pytest.MonkeyPatch, calls: Calls) -> ServerControl:
    control = ServerControl("127.0.0.1:1", "127.0.0.1:1", "s" * 43)
    monkeypatch.setattr(control, "call", calls.control)
    monkeypatch.setattr(control, "requests_held", calls.requests_held)
    monkeypatch.setattr(server_control, "DRAIN_POLL_S", 0.01)
    return control


def timed(drain) -> tuple[bool, float]:
    started = time.monotonic()
    return drain(), time.monotonic() - started


def test_idle_fronts_and_an_idle_entry_drain_after_idle_s_and_every_front_was_told(monkeypatch) -> None:
    calls = Calls()
    drained, took = timed(lambda: server(monkeypatch, calls).drain(FRONTS, 10.0, "slm", reason="why"))
    assert drained and IDLE_S <= took < IDLE_S + 1.0
    assert {(model, command, reason) for model, command, reason in calls.drains} == \
        {(front, "drain", "why") for front in FRONTS}


def test_a_busy_front_holds_the_drain_until_it_answers_none_in_flight(monkeypatch) -> None:
    calls = Calls(busy_calls=40)  # 20 rounds of two fronts
    drained, _ = timed(lambda: server(monkeypatch, calls).drain(FRONTS, 10.0, None))
    assert drained and len(calls.drains) > 40


@pytest.mark.parametrize("held", [[None], [0.0, None, 0.0, None], [1.0]], ids=["unreadable", "flaky", "busy"])
def test_an_entry_that_cannot_be_read_or_holds_requests_never_ends_the_drain_early(monkeypatch, held) -> None:
    drained, took = timed(lambda: server(monkeypatch, Calls(held=held)).drain(FRONTS, 2.0, "slm"))
    assert not drained and took >= 2.0


@pytest.mark.parametrize("calls", [Calls(taken=False), Calls(stall_s=0.5)], ids=["refused", "stalled"])
def test_a_drain_call_that_fails_or_stalls_never_ends_the_drain_early(monkeypatch, calls: Calls) -> None:
    if calls.stall_s:  # a stalled call answers "taken" late, and only after the deadline
        calls.taken = False
    drained, took = timed(lambda: server(monkeypatch, calls).drain(FRONTS, 1.5, "slm"))
    assert not drained and took >= 1.5


@pytest.fixture
def silent_port():
    """A port that accepts connections and never answers (a stalled server)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    for sock in [*accepted, listener]:
        sock.close()


def test_against_a_stalled_server_the_calls_give_up_in_time_and_say_nothing(monkeypatch, silent_port) -> None:
    """The real control call and metrics read, to a server that never answers: each returns its
    "nothing known" within the call timeout, so a drain against it runs to its deadline and no longer."""
    monkeypatch.setattr(server_control, "CALL_TIMEOUT_S", 0.5)
    server = ServerControl(f"127.0.0.1:{silent_port}", f"127.0.0.1:{silent_port}", "s" * 43)
    assert timed(lambda: server.requests_held("slm")) [0] is None
    taken, took = timed(lambda: server.call("tokenrouter", "drain", "why"))
    assert taken is False and took < 3.0
    drained, took = timed(lambda: server.drain(FRONTS, 1.0, "slm"))
    assert not drained and 1.0 <= took < 4.0
