"""The peer session over Dynamo's worker-to-worker calls (dynamo_channel.py), against the real sending
end (peer_link.py's thread and sending_session.py) and the real receiving end (peer_sessions.py),
with a stand-in for Dynamo's client: its ``direct(call, instance_id)`` runs the receiving end's
handler on an event loop of its own, after a delay the test picks per call (so calls overtake each
other), or fails as a call to a gone instance does. Dynamo itself carries them in test_pools_e2e.py."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tokenrouter.fleet.dynamo_channel import OriginSessions, answer_call, direct_opener, peer_handler
from tokenrouter.protocol import PeerMessage
from tokenrouter.serving.subserver.peer_link import PeerLink
from tokenrouter.serving.subserver.peer_sessions import LINK_PARAMETER, LINK_SECRET_PARAMETER, PeerSessions
from tokenrouter.serving.subserver.sending_session import UP

SECRET = "s" * 32
VIEW = {"models": ["a", "b"]}
ORIGIN = 99
pytestmark = pytest.mark.timeout(60)


class Answer:
    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def data(self) -> dict[str, Any]:
        return self._data


class FakeDynamoClient:
    """Dynamo's client to the peer endpoint: instances by id, each the real receiving end's handler."""

    def __init__(self, receiver: "Receiver") -> None:
        self.receiver = receiver
        self.instances = [7]
        self.delay_s: dict[int, float] = {}  # call number -> its delay (so that later calls overtake it)
        self.calls_to: list[int] = []

    def instance_ids(self) -> list[int]:
        return list(self.instances)

    async def direct(self, call: dict[str, Any], instance_id: int):
        self.calls_to.append(instance_id)
        if instance_id not in self.instances:
            raise Exception(f"Unavailable: instance_id={instance_id} not found")  # what Dynamo raises
        await asyncio.sleep(self.delay_s.get(call["number"], 0.0))
        assert call["origin"] == ORIGIN
        handler = peer_handler(lambda origin: self.receiver.sessions, self.receiver.apply)

        async def answers():
            async for answer in handler(call, None):
                yield Answer(answer)

        return answers()


class Receiver:
    def __init__(self, secret: str = SECRET) -> None:
        self.applied: list[PeerMessage] = []
        self.lost: list[str] = []
        self.sessions = PeerSessions(VIEW, {"a": secret}, here="'b'", on_session_lost=lambda s, w: self.lost.append(s))

    def apply(self, message: PeerMessage, origin: Any) -> None:
        assert origin == ORIGIN
        self.applied.append(message)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """Dynamo's event loop in a worker: its own thread, as the link's sends come from another."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def link_to(client: FakeDynamoClient, loop: asyncio.AbstractEventLoop, down: list[str], *,
            secret: str = SECRET) -> PeerLink:
    return PeerLink("a", "b", "tokenrouter.b.peer",
                    direct_opener(client, loop, lambda: next(iter(client.instance_ids()), None), ORIGIN),
                    secret=secret, view=VIEW, down_after_s=1.0, on_up=lambda peer: None,
                    on_down=lambda peer, error: down.append(error))


def progress(i: int) -> PeerMessage:
    return PeerMessage(kind="progress", rid=f"r{i}", sender="a", tokens=[i], origins=[0])


def wait_for(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_calls_that_overtake_each_other_are_applied_once_and_in_order(loop):
    receiver = Receiver()
    client = FakeDynamoClient(receiver)
    client.delay_s = {1: 0.3, 2: 0.15}  # batch 3 arrives first, then 2, then 1
    down: list[str] = []
    link = link_to(client, loop, down)
    try:
        wait_for(lambda: link.state == UP)
        for i in (1, 2, 3):
            link.send([progress(i)])
            time.sleep(0.02)  # one call each: the link ships what is queued when it wakes
        wait_for(lambda: len(receiver.applied) == 3)
        time.sleep(0.1)
        assert [m.tokens[0] for m in receiver.applied] == [1, 2, 3]
        assert link.state == UP and not down
    finally:
        link.close()


def test_a_call_without_the_secret_is_refused_and_nothing_is_applied(loop):
    receiver = Receiver(secret="t" * 32)
    client = FakeDynamoClient(receiver)
    down: list[str] = []
    link = link_to(client, loop, down)
    try:
        wait_for(lambda: "refused" in (link.problem or ""))  # (the refusal's answer comes back on the link's thread)
        assert link.state != UP
        link.send([PeerMessage(kind="handoff", rid="h0", sender="a", tokens=[1], origins=[0])])
        assert len(down) == 1 and "refused" in down[0]  # a handoff while refused loses the peer at once
        assert receiver.applied == []
    finally:
        link.close()


def test_a_gone_instance_breaks_the_stream_and_the_next_one_gets_what_was_unanswered(loop):
    receiver = Receiver()
    client = FakeDynamoClient(receiver)
    down: list[str] = []
    link = link_to(client, loop, down)
    try:
        wait_for(lambda: link.state == UP)
        client.instances = [8]  # the instance the stream was opened to is gone; another one is registered
        link.send([progress(1)])
        wait_for(lambda: len(receiver.applied) == 1)
        assert client.calls_to[-2:] == [7, 8] or 8 in client.calls_to, client.calls_to
        time.sleep(0.1)
        assert [m.tokens[0] for m in receiver.applied] == [1] and link.state == UP and not down
    finally:
        link.close()


def test_no_instance_registered_keeps_the_link_down_with_the_reason(loop):
    client = FakeDynamoClient(Receiver())
    client.instances = []
    link = link_to(client, loop, [])
    try:
        wait_for(lambda: "no instance of the peer is registered" in (link.problem or ""))
        assert link.state != UP
    finally:
        link.close()


@pytest.mark.parametrize("call", [None, {"number": 1}, {"number": 1, "payload": "[]", "parameters": "x"},
                                  {"number": 1, "payload": "not json", "parameters": {}}])
def test_a_malformed_call_is_answered_with_an_error_and_applies_nothing(call):
    receiver = Receiver()
    answer = answer_call(lambda origin: receiver.sessions, receiver.apply, call)
    assert answer["error"] and receiver.applied == []


def test_a_batch_with_a_bad_payload_is_refused_after_a_good_hello():
    receiver = Receiver()
    hello = {"number": 0, "payload": "[]",
             "parameters": {LINK_SECRET_PARAMETER: SECRET, LINK_PARAMETER: "a/e1/0",
                            "tokenrouter_link_hello": '{"models": ["a", "b"]}'}}
    assert answer_call(lambda origin: receiver.sessions, receiver.apply, hello) == {"number": 0}
    bad = {"number": 1, "payload": "{not a list", "parameters": {LINK_SECRET_PARAMETER: SECRET,
                                                                  LINK_PARAMETER: "a/e1/1"}}
    answer = answer_call(lambda origin: receiver.sessions, receiver.apply, bad)
    assert answer["number"] == 1 and answer["error"] and receiver.applied == []


def hello_from(origin: Any, epoch: str) -> dict[str, Any]:
    return {"number": 0, "payload": "[]", "origin": origin,
            "parameters": {LINK_SECRET_PARAMETER: SECRET, LINK_PARAMETER: f"a/{epoch}/0",
                           "tokenrouter_link_hello": '{"models": ["a", "b"]}'}}


def batch_from(origin: int, epoch: str, number: int, rid: str) -> dict[str, Any]:
    payload = f"[{PeerMessage(kind='progress', rid=rid, sender='a').to_json()}]"
    return {"number": number, "payload": payload, "origin": origin,
            "parameters": {LINK_SECRET_PARAMETER: SECRET, LINK_PARAMETER: f"a/{epoch}/{number}"}}


def test_each_sending_instance_has_its_own_session_and_only_its_replacement_is_reported():
    """Two instances of model 'a' talk to one receiver (a worker hearing a pool): each numbers its own
    batches from 1, each message is applied with the instance that sent it, and a new session of one
    reports that one's loss only."""
    lost: list[tuple[int, str]] = []
    applied: list[tuple[int, str]] = []
    sessions = OriginSessions(lambda origin: PeerSessions(
        VIEW, {"a": SECRET}, here="b", on_session_lost=lambda sender, why: lost.append((origin, sender))))

    def call(body: dict[str, Any]) -> dict[str, Any]:
        return answer_call(sessions, lambda message, origin: applied.append((origin, message.rid)), body)

    for origin in (1, 2):
        assert call(hello_from(origin, f"e{origin}")) == {"number": 0}
    assert call(batch_from(1, "e1", 1, "r1")) == {"number": 1}
    assert call(batch_from(2, "e2", 1, "r2")) == {"number": 1}
    assert applied == [(1, "r1"), (2, "r2")]  # (one shared session would take r2 as a duplicate)
    call(hello_from(2, "e2-new"))
    assert lost == [(2, "a")]


@pytest.mark.parametrize("origin", [None, "1", True])
def test_a_call_without_its_origin_is_refused_where_origins_are_told_apart(origin):
    applied: list[PeerMessage] = []
    sessions = OriginSessions(lambda origin: PeerSessions(VIEW, {"a": SECRET}, here="b",
                                                          on_session_lost=lambda sender, why: None))
    answer = answer_call(sessions, lambda message, _origin: applied.append(message), hello_from(origin, "e1"))
    assert "origin" in answer["error"] and applied == []
