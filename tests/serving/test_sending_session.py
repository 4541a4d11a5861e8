"""The peer session protocol (sending_session.py to peer_sessions.py) without threads or clocks:
a fake in-memory channel that the test drives call by call (deliver late, twice, out of order, or
never; answer or not; break) and a clock the test sets. Each test fails when its property breaks:
batches applied once and in order, give-up in bounded time with its request-level consequence,
liveness (heartbeats, reconnects). The threaded link over a stand-in stream: test_peer_link.py."""

from __future__ import annotations

import pytest

from tokenrouter.protocol import PeerMessage, decode_batch
from tokenrouter.serving.subserver.peer_sessions import LinkRefused, PeerSessions
from tokenrouter.serving.subserver.sending_session import CONNECTING, RECONNECTING, UP, Pacing, SendingSession

SECRET = "s" * 32
VIEW = {"models": ["a", "b"]}
DOWN_AFTER_S = 1.0


class FakeChannel:
    """One stream: calls wait in ``calls`` until the test delivers them (to the receiver) or drops them."""

    def __init__(self, peer: "FakePeer", epoch: str, number: int) -> None:
        self.peer, self.epoch, self.number = peer, epoch, number
        self.calls: list[tuple[int, bytes, dict[str, str]]] = []
        self.closed = False

    def send(self, number: int, payload: bytes, parameters: dict[str, str]) -> None:
        self.calls.append((number, payload, parameters))

    def close(self) -> None:
        self.closed = True


class FakePeer:
    """The peer's server: the receiving end of the sessions, and what it applied, in order."""

    def __init__(self) -> None:
        self.lost: list[str] = []
        self.receiver = PeerSessions(VIEW, {"a": SECRET}, here="'b'",
                                     on_session_lost=lambda sender, why: self.lost.append(sender))
        self.applied: list[int] = []
        self.channels: list[FakeChannel] = []
        self.refusing, self.refused = False, 0  # its server is down: every open is refused

    def open(self, epoch: str, number: int) -> FakeChannel:
        if self.refusing:
            self.refused += 1
            raise ConnectionRefusedError("connection refused")
        self.channels.append(FakeChannel(self, epoch, number))
        return self.channels[-1]

    def deliver(self, session: SendingSession, now: float, *, order: list[int] | None = None,
                answer: bool = True, times: int = 1) -> None:
        """The calls waiting on the current stream reach the receiver (in ``order`` of their
        positions, each ``times`` times); their answers reach the session unless ``answer`` is False."""
        channel = self.channels[-1]
        calls, channel.calls = channel.calls, []
        for index in order if order is not None else range(len(calls)):
            number, payload, parameters = calls[index]
            for _ in range(times):
                try:
                    ready = self.receiver.take(parameters, lambda: decode_batch(payload))
                    reply = (number, None)
                except LinkRefused as refused:
                    reply = (None, str(refused))
                self.applied += [m.tokens[0] for m in ready]
                if answer:
                    session.answered(channel.epoch, *reply, now)


class Calls:
    def __init__(self) -> None:
        self.up: list[str] = []
        self.down: list[tuple[str, str]] = []


def message(i: int, kind: str = "progress") -> PeerMessage:
    """Message ``i`` (its one token says which), of request ``h<i>`` for a handoff, else ``r<i>``."""
    return PeerMessage(kind=kind, rid=f"{'h' if kind == 'handoff' else 'r'}{i}", sender="a", tokens=[i], origins=[0])


def new_session(pacing: Pacing = Pacing()) -> tuple[SendingSession, FakePeer, Calls]:
    peer, calls = FakePeer(), Calls()
    session = SendingSession("a", "b", "peer:1", peer.open, secret=SECRET, view=VIEW, down_after_s=DOWN_AFTER_S,
                             on_up=calls.up.append, on_down=lambda p, error: calls.down.append((p, error)),
                             pacing=pacing)
    return session, peer, calls


def up_session(pacing: Pacing = Pacing()) -> tuple[SendingSession, FakePeer, Calls]:
    """A session that said hello to a fresh peer and is up; the peer; what the session called back."""
    session, peer, calls = new_session(pacing)
    session.tick(0.0)  # opens a stream and says hello
    peer.deliver(session, 0.0)
    assert session.state == UP and calls.up == ["b"]
    return session, peer, calls


def queue_batches(session: SendingSession, first: int, count: int, now: float) -> None:
    """``count`` batches of one message each, shipped one per tick."""
    for i in range(first, first + count):
        session.queued(session.epoch, now, [message(i)])
        session.tick(now)


def test_batches_delivered_out_of_order_are_applied_in_their_numbers_order():
    session, peer, calls = up_session()
    queue_batches(session, 0, 6, 0.1)
    peer.deliver(session, 0.2, order=[3, 1, 5, 0, 4, 2])
    assert peer.applied == list(range(6))


def test_a_batch_delivered_twice_is_applied_once():
    session, peer, calls = up_session()
    queue_batches(session, 0, 5, 0.1)
    peer.deliver(session, 0.2, times=3)
    assert peer.applied == list(range(5))


@pytest.mark.parametrize("lost", ["answers", "deliveries"])
def test_after_a_broken_stream_every_unanswered_batch_goes_again_and_is_applied_once(lost):
    """The peer applied batches whose answers were lost (they come again: applied once), or never
    got them (they come again: none dropped); either way in order, on the same session."""
    session, peer, calls = up_session()
    queue_batches(session, 0, 3, 0.1)
    peer.deliver(session, 0.1)
    queue_batches(session, 3, 3, 0.2)
    if lost == "answers":
        peer.deliver(session, 0.2, answer=False)
    else:
        peer.channels[-1].calls.clear()
    session.broken(peer.channels[-1].number, "cut", 0.3)
    assert session.state == RECONNECTING and peer.channels[-1].closed
    queue_batches(session, 6, 2, 0.3)  # queued while it reconnects: they wait for the new stream
    session.tick(0.3)  # reconnects at once
    peer.deliver(session, 0.3)  # the hello: the batches go again after it
    peer.deliver(session, 0.3)
    session.tick(0.3)
    peer.deliver(session, 0.3)
    assert peer.applied == list(range(8))
    assert session.state == UP and calls.down == [] and calls.up == ["b"] and peer.lost == []


def test_a_peer_that_answers_nothing_is_given_up_after_down_after_s_and_not_before():
    session, peer, calls = up_session()
    session.queued(session.epoch, 1.0, [message(0)])
    session.tick(1.0)
    peer.channels[-1].calls.clear()  # silence: no delivery, no answer
    old_epoch = session.epoch
    session.queued(old_epoch, 9.0, [message(1, "handoff")])  # held (a delay): dropped when the session goes
    session.tick(1.0 + DOWN_AFTER_S)
    assert calls.down == [] and session.state == UP
    session.tick(1.0 + DOWN_AFTER_S + 0.01)
    assert session.state == CONNECTING and len(calls.down) == 1  # the one consequence: the peer is lost
    assert calls.down[0][0] == "b" and "model 'b' at peer:1 is unreachable: no answer for 1 s" in calls.down[0][1]
    assert peer.channels[-1].closed and "not connected" in session.unreachable()
    session.queued(old_epoch, 2.1, [message(2, "handoff")])  # queued before it went: that loss ended its request
    assert len(calls.down) == 1
    session.tick(5.0)
    peer.deliver(session, 5.0)
    session.tick(9.5)
    peer.deliver(session, 9.5)
    assert session.state == UP and peer.applied == []  # nothing of the lost session goes in the new one


def test_a_lost_session_comes_back_as_a_new_one_and_the_peer_gives_up_the_old():
    session, peer, calls = up_session()
    first_epoch = session.epoch
    queue_batches(session, 0, 1, 0.1)
    peer.channels[-1].calls.clear()
    session.tick(0.1 + DOWN_AFTER_S + 0.01)
    assert session.state == CONNECTING and session.epoch != first_epoch
    session.tick(5.0)  # a new stream, a hello with the new epoch
    peer.deliver(session, 5.0)
    assert session.state == UP and calls.up == ["b", "b"] and peer.lost == ["a"]
    queue_batches(session, 10, 1, 5.1)
    peer.deliver(session, 5.1)
    assert peer.applied == [10]  # numbering restarts with the session: the old batch is not owed


def test_an_idle_session_sends_heartbeats_and_stays_up_while_they_are_answered():
    session, peer, calls = up_session()
    now = 0.0
    heartbeats = 0
    while now < 10 * DOWN_AFTER_S:
        now += DOWN_AFTER_S / 8
        session.tick(now)
        heartbeats += sum(1 for number, _, _ in peer.channels[-1].calls if number)
        peer.deliver(session, now)
    assert session.state == UP and calls.down == []
    assert 30 <= heartbeats <= 41  # one per quarter of down_after_s
    assert session.next_wakeup(now) <= now + DOWN_AFTER_S / 4


def test_a_stream_that_cannot_be_reopened_loses_the_session_within_down_after_s():
    session, peer, calls = up_session()
    session.broken(peer.channels[-1].number, "cut", 1.0)
    peer.refusing = True
    now = 1.0
    while now < 1.0 + DOWN_AFTER_S:
        session.tick(now)
        now += 0.05
    assert session.state == RECONNECTING and calls.down == []
    session.tick(1.0 + DOWN_AFTER_S + 0.01)
    assert session.state == CONNECTING and len(calls.down) == 1 and "no new stream within 1 s" in calls.down[0][1]
    assert 3 <= peer.refused <= 8  # retried with a growing delay, not at every tick


def test_a_stale_streams_break_or_an_old_sessions_answer_changes_nothing():
    session, peer, calls = up_session()
    queue_batches(session, 0, 1, 0.1)
    session.broken(peer.channels[-1].number + 7, "an older stream", 0.2)
    session.answered("another-epoch", 1, "refused", 0.2)
    assert session.state == UP
    peer.deliver(session, 0.2)
    assert peer.applied == [0]


def test_with_one_call_in_flight_what_is_queued_meanwhile_goes_in_the_next_call_once_answered():
    session, peer, calls = up_session(Pacing(in_flight=1))
    queue_batches(session, 0, 4, 0.1)  # the first goes; the other three wait for its answer
    assert [number for number, _, _ in peer.channels[-1].calls] == [1]
    assert session.next_wakeup(0.1) == pytest.approx(0.1 + DOWN_AFTER_S)  # no heartbeat while one is out
    session.tick(0.5)
    assert len(peer.channels[-1].calls) == 1
    peer.deliver(session, 0.5)
    session.tick(0.5)
    (number, payload, _), = peer.channels[-1].calls
    assert number == 2 and [m.tokens[0] for m in decode_batch(payload)] == [1, 2, 3]
    peer.deliver(session, 0.5)
    assert peer.applied == [0, 1, 2, 3] and calls.down == []


def test_held_while_connecting_messages_go_once_up_and_the_peer_is_lost_after_down_after_s():
    session, peer, calls = new_session(Pacing(hold_while_connecting=True))
    session.queued(session.epoch, 0.0, [message(0, "handoff")])
    session.tick(0.0)  # hello out, not answered yet
    assert session.state == CONNECTING and calls.down == []
    peer.deliver(session, 0.1)
    session.tick(0.1)
    peer.deliver(session, 0.1)
    assert peer.applied == [0] and calls.down == []
    held, held_peer, calls = new_session(Pacing(hold_while_connecting=True))
    held.queued(held.epoch, 0.0, [message(1, "handoff"), message(2)])
    held.tick(DOWN_AFTER_S)
    assert calls.down == [] and held.next_wakeup(DOWN_AFTER_S) <= DOWN_AFTER_S + 0.05
    held.tick(DOWN_AFTER_S + 0.01)
    (peer_name, error), = calls.down
    assert peer_name == "b" and "model 'b' at peer:1 is unreachable" in error and "messages waited 1 s" in error
    held.tick(5.0)
    held_peer.deliver(held, 5.0)
    held.tick(5.0)
    held_peer.deliver(held, 5.0)
    assert held.state == UP and held_peer.applied == []  # what was held went with the peer


@pytest.mark.parametrize("max_retry_s", [0.1, 2.0])
def test_a_refused_hello_is_asked_again_after_the_pacings_longest_wait(max_retry_s):
    session, peer, calls = new_session(Pacing(max_retry_s=max_retry_s))
    session.tick(0.0)
    session.answered(session.epoch, None, "Model 'b' is not ready", 0.0)
    session.tick(max_retry_s - 0.01)
    assert len(peer.channels) == 1
    session.tick(max_retry_s)
    assert len(peer.channels) == 2
