"""A link between subservers on two servers (peer_link.py) against its receiving end
(peer_sessions.py), over an in-memory stand-in for the stream that a test can cut, silence, or make
lose deliveries and answers. The real stream between two tritonservers: tests/e2e/test_two_servers.py.
"""

from __future__ import annotations

import threading
import time

import pytest

from helpers.waiting import wait_for
from tokenrouter.protocol import PeerMessage, decode_batch
from tokenrouter.serving.subserver.peer_link import PeerLink
from tokenrouter.serving.subserver.peer_sessions import (HELLO_PARAMETER, LINK_PARAMETER, LINK_SECRET_PARAMETER,
                                                         LinkRefused, PeerSessions, link_parameter)

SECRET = "s" * 32
VIEW = {"models": ["a", "b"], "scheduling.max_active": 8}
DOWN_AFTER_S = 0.6


class Stream:
    def __init__(self, wire: "Wire", on_answer, on_broken) -> None:
        self.wire, self.on_answer, self.on_broken, self.broken = wire, on_answer, on_broken, False

    def send(self, number: int, payload: bytes, parameters: dict[str, str]) -> None:
        wire = self.wire
        with wire.lock:
            wire.calls.append((number, parameters.get(LINK_PARAMETER)))
            wire.shipped += len(decode_batch(payload))
            if self.broken or wire.silent or (number and wire.lose_deliveries):
                return
            try:
                wire.received += wire.sessions.take(parameters, lambda: decode_batch(payload))
                answer = (number, None)
            except LinkRefused as refused:
                answer = (None, str(refused))  # Triton's error responses may not echo the id
            if number and wire.lose_answers:
                return
        self.on_answer(*answer)

    def close(self) -> None:
        self.broken = True

    def cut(self) -> None:
        self.broken = True
        self.on_broken("cut")


class Wire:
    """The peer's server as the link sees it: every stream it opens, and what the peer applied."""

    def __init__(self, view: dict = VIEW) -> None:
        self.lost: list[tuple[str, str]] = []
        self.sessions = PeerSessions(view, {"a": SECRET}, here="'b' at peer:1",
                                     on_session_lost=lambda sender, why: self.lost.append((sender, why)))
        self.received: list[PeerMessage] = []
        self.calls: list[tuple[int, str]] = []
        self.shipped = 0  # messages in every call, resent ones again
        self.streams: list[Stream] = []
        self.lock = threading.Lock()
        self.silent = self.lose_deliveries = self.lose_answers = self.refuse_opens = False
        self.refused_opens = 0

    def open(self, on_answer, on_broken) -> Stream:
        if self.refuse_opens:
            self.refused_opens += 1
            raise ConnectionRefusedError("connection refused")
        self.streams.append(Stream(self, on_answer, on_broken))
        return self.streams[-1]


class Events:
    def __init__(self) -> None:
        self.up: list[str] = []
        self.down: list[tuple[str, str, float]] = []


def link_to(wire: Wire, events: Events, delay_s: float = 0.0) -> PeerLink:
    return PeerLink("a", "b", "peer:1", wire.open, secret=SECRET, view=VIEW, down_after_s=DOWN_AFTER_S,
                    delay_s=delay_s, on_up=events.up.append,
                    on_down=lambda peer, error: events.down.append((peer, error, time.monotonic())))


def progress(i: int) -> PeerMessage:
    return PeerMessage(kind="progress", rid=f"r{i}", sender="a", tokens=[i], origins=[0])


@pytest.fixture
def wire() -> Wire:
    return Wire()


@pytest.fixture
def events() -> Events:
    return Events()


def test_a_steps_messages_arrive_in_order_exactly_once_and_the_link_never_waits(wire, events):
    link = link_to(wire, events)
    wait_for(lambda: link.state == "up")
    assert events.up == ["b"]
    for i in range(0, 300, 3):  # one step's messages to this peer: three at a time
        started = time.perf_counter()
        link.send([progress(i), progress(i + 1), progress(i + 2)])
        assert time.perf_counter() - started < 0.005  # only queued
    wait_for(lambda: len(wire.received) == 300)
    assert [m.tokens[0] for m in wire.received] == list(range(300))
    link.close()


@pytest.mark.parametrize("lost", ["answers", "deliveries"])
def test_across_a_reconnect_every_message_is_applied_once_in_order(wire, events, lost):
    """The stream breaks while batches are in flight: either the peer applied them but its answers
    were lost (so the link sends them again: the peer must not apply them twice), or they never
    arrived (the link must send them again: none may be dropped). Fails on a duplicated or a
    dropped message, and on one applied out of order."""
    link = link_to(wire, events)
    wait_for(lambda: link.state == "up")
    for i in range(20):
        link.send([progress(i)])
    wait_for(lambda: len(wire.received) == 20)
    setattr(wire, f"lose_{lost}", True)
    for i in range(20, 40):
        link.send([progress(i)])
    wait_for(lambda: wire.shipped >= 40)
    setattr(wire, f"lose_{lost}", False)
    wire.streams[-1].cut()
    for i in range(40, 50):  # sent while it reconnects: they wait for the new stream
        link.send([progress(i)])
    wait_for(lambda: len(wire.received) >= 50)
    time.sleep(0.1)
    assert [m.tokens[0] for m in wire.received] == list(range(50))
    assert len(wire.streams) == 2 and events.down == [] and events.up == ["b"] and wire.lost == []
    link.close()


def test_a_peer_that_answers_nothing_is_given_up_in_bounded_time_and_taken_back_when_it_answers(wire, events):
    link = link_to(wire, events)
    wait_for(lambda: link.state == "up")
    handoff = PeerMessage(kind="handoff", rid="h0", sender="a", tokens=[1], origins=[0])
    wire.silent = True  # the network drops everything: no answer, no error
    silenced = time.monotonic()
    link.send([handoff])
    wait_for(lambda: events.down, timeout_s=3 * DOWN_AFTER_S)
    peer, error, at = events.down[0]
    assert peer == "b" and "model 'b' at peer:1 is unreachable" in error
    assert at - silenced < DOWN_AFTER_S + 0.5  # within down_after_s (and a heartbeat)
    assert link.problem is not None
    link.send([PeerMessage(kind="release", rid="h0", sender="a")])  # nothing to tell a lost peer: dropped
    assert len(events.down) == 1
    link.send([handoff])  # a handoff while it is lost: lost with the peer, at once
    assert len(events.down) == 2 and "model 'b' at peer:1 is not connected" in events.down[1][1]
    wire.silent = False
    wait_for(lambda: link.state == "up")
    assert events.up == ["b", "b"] and link.problem is None
    assert wire.lost and wire.lost[0][0] == "a" and "new session" in wire.lost[0][1]  # the peer gives up the old one
    link.send([progress(7)])
    wait_for(lambda: wire.received and wire.received[-1].tokens == [7])
    link.close()


def test_a_peer_server_that_is_gone_is_retried_with_backoff_and_connected_when_it_starts(wire, events):
    wire.refuse_opens = True
    link = link_to(wire, events)
    time.sleep(1.0)
    assert link.state == "connecting" and "connection refused" in link.problem
    # 0.05 s doubling: opens at about 0, 0.05, 0.15, 0.35, 0.75 s (a link that retried at once would
    # have tried hundreds of times, one with no retry once)
    assert 3 <= wire.refused_opens <= 7, wire.refused_opens
    assert wire.calls == []
    wire.refuse_opens = False
    wait_for(lambda: link.state == "up", timeout_s=4.0)
    link.close()


def test_a_peer_with_another_deployment_is_refused_naming_the_value(events):
    wire = Wire(view={**VIEW, "scheduling.max_active": 16})
    link = link_to(wire, events)
    wait_for(lambda: "refused" in (link.problem or ""))
    assert "scheduling.max_active: 16 at 'b' at peer:1, 8 at 'a'" in link.problem and events.up == []
    link.send([PeerMessage(kind="handoff", rid="h", sender="a")])
    (peer, error, _), = events.down
    assert peer == "b" and "scheduling.max_active" in error
    link.close()


def test_an_idle_link_keeps_talking_and_a_delay_holds_each_batch(wire, events):
    link = link_to(wire, events, delay_s=0.1)
    wait_for(lambda: link.state == "up")
    time.sleep(DOWN_AFTER_S)
    assert sum(1 for number, _ in wire.calls if number) >= 2 and events.down == []  # heartbeats, answered
    sent = time.monotonic()
    link.send([progress(1)])
    wait_for(lambda: wire.received)
    assert time.monotonic() - sent >= 0.1
    link.close()


def test_the_receiving_end_refuses_what_is_not_a_genuine_link_call():
    sessions = PeerSessions(VIEW, {"a": SECRET}, here="'b'", on_session_lost=lambda *a: None)
    hello = {LINK_SECRET_PARAMETER: SECRET, LINK_PARAMETER: link_parameter("a", "e1", 0),
             HELLO_PARAMETER: '{"models": ["a", "b"], "scheduling.max_active": 8}'}
    never = lambda: pytest.fail("decoded a call that is refused")  # noqa: E731
    for parameters, error in (({**hello, LINK_SECRET_PARAMETER: "x" * 32}, "from 'a' to 'b' without its secret"),
                              ({k: v for k, v in hello.items() if k != LINK_SECRET_PARAMETER}, "without its secret"),
                              ({**hello, LINK_PARAMETER: "a/e1"}, "must be SENDER/EPOCH/NUMBER"),
                              ({**hello, LINK_PARAMETER: link_parameter("c", "e1", 0)}, "'c' is not a peer model"),
                              ({**hello, LINK_PARAMETER: link_parameter("a", "e1", 1)}, "no session e1")):
        with pytest.raises(LinkRefused, match=error):
            sessions.take(parameters, never)
    assert sessions.take(hello, never) == []
    forged = {**hello, LINK_PARAMETER: link_parameter("a", "e1", 1)}
    with pytest.raises(LinkRefused, match="another sender's messages"):
        sessions.take(forged, lambda: [PeerMessage(kind="release", rid="r", sender="b")])


def test_a_batch_that_comes_early_waits_for_the_ones_before_it():
    sessions = PeerSessions(VIEW, {"a": SECRET}, here="'b'", on_session_lost=lambda *a: None)
    base = {LINK_SECRET_PARAMETER: SECRET}
    sessions.take({**base, LINK_PARAMETER: link_parameter("a", "e", 0), HELLO_PARAMETER: '{"models": ["a", "b"], '
                   '"scheduling.max_active": 8}'}, list)
    take = lambda n: [m.tokens[0] for m in sessions.take(  # noqa: E731
        {**base, LINK_PARAMETER: link_parameter("a", "e", n)}, lambda: [progress(n)])]
    assert take(2) == [] and take(3) == [] and take(1) == [1, 2, 3] and take(2) == [] and take(4) == [4]
