"""A same-server peer link: PeerLink's session over BlsChannel (BLS calls through a fake pb_utils)
into the real receiving end (PeerSessions), as the peer model's intake would apply them. The
properties: what is sent is applied once and in order; one BLS call at a time, and what is queued
meanwhile goes together in the next one; a call that raises reopens the channel on the same
session; a refused batch loses the session (``on_down``: ``Subserver.peer_lost``); messages wait for
a server that is still loading, with no call into it before it serves (Triton hands a model its first
request only then), and the peer is lost once that took ``down_after_s``, as is a peer whose call never
returns. The real server:
tests/e2e (every routed request hands off between models of one server)."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator

import pytest

from helpers.waiting import wait_for
from fake_pb_utils import BlsCall, EntryResponse, fake_pb

from tokenrouter.protocol import PeerMessage, decode_batch
from tokenrouter.serving.schema import PEER_INPUT
from tokenrouter.serving.subserver.bls_channel import SAME_SERVER, BlsChannel, ServerServing
from tokenrouter.serving.subserver.peer_link import PeerLink
from tokenrouter.serving.subserver.peer_sessions import LINK_SECRET_PARAMETER, LinkRefused, PeerSessions
from tokenrouter.serving.subserver.sending_session import CONNECTING, UP

SECRET = "server-start-secret"
VIEW = {"models": ["slm", "llm"]}
DOWN_AFTER_S = 0.5


def message(i: int, kind: str = "progress") -> PeerMessage:
    return PeerMessage(kind=kind, rid=f"r{i}", sender="slm", tokens=[i], origins=[0])


class PeerModel:
    """The peer model 'llm' as BLS reaches it: its intake's receiving end, what it applied, and the
    calls it is in (a test can hold them, make them raise, or keep the server loading: it has not
    served a request yet, and Triton would refuse any call)."""

    def __init__(self) -> None:
        self.lost: list[str] = []
        self.sessions = PeerSessions(VIEW, {"slm": SECRET}, here="'llm'",
                                     on_session_lost=lambda sender, why: self.lost.append(sender))
        self.applied: list[int] = []
        self.batches: list[list[int]] = []  # the tokens of each non-empty batch applied, per call
        self.serving = ServerServing()
        self.serving.saw_a_request()
        self.calls_while_loading = 0
        self.gate = threading.Event()
        self.gate.set()
        self.raise_next = 0  # calls that raise (the server stopping) before any reaches the model
        self.refuse_batches = False
        self.in_call = 0
        self.most_in_call = 0
        self.lock = threading.Lock()

    def answer(self, call: BlsCall) -> Iterator[EntryResponse]:
        assert call.model_name == "llm" and call.decoupled and call.outputs == []
        with self.lock:
            self.in_call += 1
            self.most_in_call = max(self.most_in_call, self.in_call)
        try:
            self.gate.wait(5)
            if self.raise_next:
                self.raise_next -= 1
                raise RuntimeError("Failed to execute the inference request: the server is stopping")
            if not self.serving():  # Triton refuses any call while the server loads
                self.calls_while_loading += 1
                return iter([EntryResponse(error="Server not ready")])
            payload = call.inputs[PEER_INPUT].reshape(-1)[0]
            try:
                if self.refuse_batches and not call.parameters.get("tokenrouter_link", "").endswith("/0"):
                    raise LinkRefused("refused by the test")
                ready = self.sessions.take(call.parameters, lambda: decode_batch(payload))
            except LinkRefused as refused:
                return iter([EntryResponse(error=str(refused))])
            tokens = [m.tokens[0] for m in ready]
            self.applied += tokens
            if tokens:
                self.batches.append(tokens)
            return iter([EntryResponse()])  # the intake's bare FINAL
        finally:
            with self.lock:
                self.in_call -= 1


class Calls:
    def __init__(self) -> None:
        self.up: list[str] = []
        self.down: list[str] = []


@contextmanager
def link_to(peer: PeerModel, calls: Calls) -> Iterator[tuple[PeerLink, list[BlsCall]]]:
    """The link from 'slm' to ``peer`` and the BLS calls it makes; closed on the way out."""
    pb = fake_pb(answer=peer.answer)
    link = PeerLink("slm", "llm", "this server", lambda on_answer, on_broken: BlsChannel(
                        pb, "llm", on_answer, on_broken, server_serving=peer.serving),
                    secret=SECRET, view=VIEW, down_after_s=DOWN_AFTER_S, pacing=SAME_SERVER,
                    on_up=calls.up.append, on_down=lambda peer, error: calls.down.append(error))
    try:
        yield link, pb.bls_calls
    finally:
        link.close()


def test_messages_are_applied_once_in_order_one_call_at_a_time_with_a_burst_in_one_call() -> None:
    peer, calls = PeerModel(), Calls()
    with link_to(peer, calls) as (link, bls_calls):
        wait_for(lambda: link.state == UP)
        assert all(call.parameters[LINK_SECRET_PARAMETER] == SECRET for call in bls_calls)
        peer.gate.clear()  # the next call waits in the peer: what is sent meanwhile must wait too
        link.send([message(0)])
        wait_for(lambda: peer.in_call == 1)
        for i in range(1, 6):
            link.send([message(i)])
        time.sleep(0.05)
        peer.gate.set()
        wait_for(lambda: peer.applied == list(range(6)))
        assert peer.batches == [[0], [1, 2, 3, 4, 5]]  # the burst queued behind the first call: one call
        assert peer.most_in_call == 1 and calls.down == []


def test_a_call_that_raises_reopens_the_channel_and_the_batch_goes_again_on_the_same_session() -> None:
    peer, calls = PeerModel(), Calls()
    with link_to(peer, calls) as (link, _):
        wait_for(lambda: link.state == UP)
        peer.raise_next = 1
        link.send([message(0)])
        link.send([message(1)])
        wait_for(lambda: peer.applied == [0, 1])
        assert calls.down == [] and peer.lost == [] and link.state == UP


def test_a_refused_batch_loses_the_peer_and_a_new_session_follows() -> None:
    peer, calls = PeerModel(), Calls()
    with link_to(peer, calls) as (link, _):
        wait_for(lambda: link.state == UP)
        peer.refuse_batches = True
        link.send([message(0)])
        wait_for(lambda: calls.down)
        assert "model 'llm' at this server is unreachable: it refused a batch: refused by the test" in calls.down[0]
        peer.refuse_batches = False
        wait_for(lambda: calls.up == ["llm", "llm"])  # a new session: the peer gives the old one up
        wait_for(lambda: peer.lost == ["slm"])


def test_messages_wait_for_a_server_that_is_loading() -> None:
    peer, calls = PeerModel(), Calls()
    peer.serving = ServerServing()  # loading
    with link_to(peer, calls) as (link, _):
        time.sleep(0.05)
        assert link.state == CONNECTING
        link.send([message(0, "handoff")])  # held, not refused
        time.sleep(0.1)
        peer.serving.saw_a_request()
        wait_for(lambda: peer.applied == [0], timeout_s=DOWN_AFTER_S)
        assert calls.down == []
        assert peer.calls_while_loading == 0


def test_a_peer_that_never_loads_is_lost_after_down_after_s_with_what_was_held() -> None:
    peer, calls = PeerModel(), Calls()
    peer.serving = ServerServing()  # loading
    with link_to(peer, calls) as (link, _):
        sent = time.monotonic()
        link.send([message(0, "handoff")])
        wait_for(lambda: calls.down, timeout_s=5 * DOWN_AFTER_S)
        assert time.monotonic() - sent >= DOWN_AFTER_S
        error, = calls.down
        assert "model 'llm' at this server is unreachable" in error and "has not served a request yet" in error
        peer.serving.saw_a_request()
        wait_for(lambda: link.state == UP)
        time.sleep(0.05)
        assert peer.applied == []  # the held handoff went with the lost session
        assert peer.calls_while_loading == 0


@pytest.mark.parametrize("raises", [False, True], ids=["answered", "raised"])
def test_a_closed_channel_reports_nothing_and_makes_no_more_calls(raises: bool) -> None:
    peer = PeerModel()
    peer.gate.clear()
    peer.raise_next = 1 if raises else 0
    pb = fake_pb(answer=peer.answer)
    reports: list[object] = []
    channel = BlsChannel(pb, "llm", lambda number, error: reports.append(number), reports.append,
                         server_serving=lambda: True)
    channel.send(1, b"[]", {})
    channel.send(2, b"[]", {})
    wait_for(lambda: peer.in_call == 1)
    channel.close()
    peer.gate.set()
    time.sleep(0.05)
    assert reports == [] and len(pb.bls_calls) == 1


def test_a_peer_whose_call_never_returns_is_lost_after_down_after_s_and_the_link_closes_at_once() -> None:
    """Why a BLS call runs on the channel's thread, not the link's: the link keeps the session's clock
    while a blocking exec waits on a peer stub that hangs without crashing."""
    peer, calls = PeerModel(), Calls()
    try:
        with link_to(peer, calls) as (link, _):
            wait_for(lambda: link.state == UP)
            peer.gate.clear()  # the peer takes the next call and answers nothing (for 5 s)
            sent = time.monotonic()
            link.send([message(0, "handoff")])
            wait_for(lambda: calls.down, timeout_s=4 * DOWN_AFTER_S)
            assert time.monotonic() - sent >= DOWN_AFTER_S
            assert f"no answer for {DOWN_AFTER_S:g} s" in calls.down[0]
            closing = time.monotonic()
        assert time.monotonic() - closing < 1.0  # closing did not wait for the call either
    finally:
        peer.gate.set()
