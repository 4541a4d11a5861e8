"""A request whose large-model instance is lost goes on at another instance, through the real pieces:
the entry's subserver loop and its PinnedTransport, two peer subserver loops of the large model (the
pool's instances), and links that carry the messages in process (the lost instance's takes them and
answers nothing, as a killed worker does). Engines are small in-test ones (no weights, no server:
helpers/pool_loops.py)."""

from __future__ import annotations

from tokenrouter.fleet.pinned_transport import PinnedTransport
from tokenrouter.protocol import RequestSpec
from tokenrouter.runtime.core import SubserverCore
from tokenrouter.runtime.strategies import Strategy
from tokenrouter.runtime.subserver import Subserver
from tokenrouter.runtime.transport import InProcessTransport
from tokenrouter.serving.subserver.sending_session import CONNECTING, UP

from helpers.done_sink import DoneSink
from helpers.pool_loops import (LIMITS, MAX_TOKENS, PROMPT, EveryThirdToTheLarge, Link, PositionEngine,
                                expected_tokens, wait_for)


class Pool:
    """The entry's loop and two peer loops of the large model; instance 1's worker is dead (its link takes
    the handoff and answers nothing) and instance 2's link is ``second_state``."""

    def __init__(self, second_state: str = UP) -> None:
        policy = EveryThirdToTheLarge()
        self.entry_engine, self.engines = PositionEngine(), {1: PositionEngine(), 2: PositionEngine()}
        self.transport = PinnedTransport(on_lost=lambda rid, error: self.entry.fail(rid, error),
                                         on_moved=lambda peer, rid: self.entry.peer_forgot(peer, rid))
        self.entry = Subserver(SubserverCore("slm", ["slm", "llm"], "slm", policy, LIMITS,
                                             capacities={"slm": (64, 4), "llm": (64, 4)}),
                               self.entry_engine, self.transport, Strategy())
        back = InProcessTransport()
        back.connect("slm", self.entry.deliver)
        self.peers = {i: Subserver(SubserverCore("llm", ["slm", "llm"], "slm", policy, LIMITS), engine, back,
                                   Strategy()) for i, engine in self.engines.items()}
        self.links = {1: Link(None), 2: Link(self.peers[2].deliver)}
        self.links[2].state = second_state
        for instance, link in self.links.items():
            self.transport.add("llm", instance, link)  # type: ignore[arg-type]

    def lose_the_first_instance_under(self, sink: DoneSink) -> None:
        """Start everything, submit the request, and lose instance 1 once the request is away there."""
        for server in (self.entry, *self.peers.values()):
            server.start()
        self.entry.submit("r0", PROMPT, RequestSpec(prompt_len=len(PROMPT), max_tokens=MAX_TOKENS), sink)
        wait_for(lambda: self.links[1].handoffs == 1, "the request was not handed to instance 1")
        assert self.transport.pinned("llm") == {1: 1, 2: 0} and not sink.done.is_set()
        self.transport.instance_lost("llm", 1, "model 'llm' instance 1 is unreachable")  # (on Dynamo's loop)
        assert sink.done.wait(5), "the request did not end"

    def stop(self) -> None:
        for server in (self.entry, *self.peers.values()):
            server.stop()


def test_a_request_away_at_a_lost_instance_ends_at_the_other_with_the_same_tokens_and_kv_balances():
    pool, sink = Pool(), DoneSink()
    try:
        pool.lose_the_first_instance_under(sink)
        assert (sink.finish, sink.error, sink.tokens) == ("length", None, expected_tokens(PROMPT, MAX_TOKENS))
        assert pool.links[1].handoffs == 1 and pool.peers[2].stats.handoffs_in >= 2  # the first visit, then appends
        wait_for(lambda: not pool.engines[2].held and not pool.peers[2].requests, "instance 2 kept the request's KV")
        wait_for(lambda: not pool.entry_engine.held and not pool.entry.requests, "the entry kept the request's KV")
        wait_for(lambda: pool.transport.pinned("llm") == {1: 0, 2: 0}, "the request stayed pinned")
    finally:
        pool.stop()


def test_with_no_other_instance_linked_the_request_ends_with_the_loss_and_frees_its_kv():
    pool, sink = Pool(second_state=CONNECTING), DoneSink()
    try:
        pool.lose_the_first_instance_under(sink)
        assert sink.finish == "error" and sink.error == "model 'llm' instance 1 is unreachable"
        wait_for(lambda: not pool.entry_engine.held and not pool.entry.requests, "the entry kept the request's KV")
        assert pool.transport.pinned("llm") == {1: 0, 2: 0} and pool.links[2].handoffs == 0  # (unpinned at the loss)
    finally:
        pool.stop()
