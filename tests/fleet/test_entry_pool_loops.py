"""Two entry workers sharing one peer instance, through the real pieces in one process: two entry
subserver loops (each with its PinnedTransport to the peer pool), one peer subserver loop whose
transport is the peer's own (each request back to the entry instance that owns it) and whose
receiving end is EntryOwners (owners read off each call's origin), and in-process links. Engines
are small in-test ones (helpers/pool_loops.py)."""

from __future__ import annotations

from tokenrouter.fleet.entry_owners import EntryOwners
from tokenrouter.fleet.pinned_transport import PinnedTransport
from tokenrouter.protocol import RequestSpec
from tokenrouter.runtime.core import SubserverCore
from tokenrouter.runtime.strategies import Strategy
from tokenrouter.runtime.subserver import Subserver

from helpers.done_sink import DoneSink
from helpers.pool_loops import LIMITS, EveryThirdToTheLarge, Link, PositionEngine, expected_tokens, wait_for

ENTRIES, PEER = (10, 20), 1
LONG = 40  # tokens of a request still running when its entry is lost


class TwoEntries:
    def __init__(self) -> None:
        policy = EveryThirdToTheLarge()
        self.peer_engine = PositionEngine()
        self.peer_transport = PinnedTransport(on_lost=lambda rid, error: self.peer.fail(rid, error))
        self.peer = Subserver(SubserverCore("llm", ["slm", "llm"], "slm", policy, LIMITS), self.peer_engine,
                              self.peer_transport, Strategy())
        self.owners = EntryOwners(self.peer_transport, "slm", self.peer.deliver)
        self.engines = {e: PositionEngine() for e in ENTRIES}
        self.transports: dict[int, PinnedTransport] = {}
        self.entries: dict[int, Subserver] = {}
        self.back: dict[int, Link] = {}  # the peer's link to each entry instance
        self.out: dict[int, Link] = {}  # each entry's link to the peer
        for e in ENTRIES:
            transport = PinnedTransport(on_lost=lambda rid, error, e=e: self.entries[e].fail(rid, error),
                                        on_moved=lambda peer, rid, e=e: self.entries[e].peer_forgot(peer, rid))
            self.out[e] = Link(lambda message, e=e: self.owners(message, e))
            transport.add("llm", PEER, self.out[e])  # type: ignore[arg-type]
            self.transports[e] = transport
            self.entries[e] = Subserver(SubserverCore("slm", ["slm", "llm"], "slm", policy, LIMITS,
                                                      capacities={"slm": (64, 4), "llm": (32, 4)}),
                                        self.engines[e], transport, Strategy())
            self.back[e] = Link(self.entries[e].deliver)
            self.peer_transport.add("slm", e, self.back[e])  # type: ignore[arg-type]
        for server in (self.peer, *self.entries.values()):
            server.start()

    def submit(self, entry: int, rid: str, prompt: list[int], max_tokens: int) -> DoneSink:
        sink = DoneSink()
        self.entries[entry].submit(rid, prompt, RequestSpec(prompt_len=len(prompt), max_tokens=max_tokens), sink)
        return sink

    def stop(self) -> None:
        for server in (self.peer, *self.entries.values()):
            server.stop()


def test_one_peer_answers_each_entry_s_requests_on_that_entry_and_frees_them():
    """Requests of both entries at once on one peer instance: each ends at its own entry with its tokens
    (a message sent to the other entry would leave its request hanging there); then nothing is held or
    pinned anywhere, and the peer read N as both entries' counts together."""
    pool = TwoEntries()
    try:
        prompts = {10: [1, 2, 3, 4], 20: [4, 3, 2]}
        sinks = {(e, i): pool.submit(e, f"{e}-{i}", prompts[e], 12) for e in ENTRIES for i in range(2)}
        for (e, _), sink in sinks.items():
            assert sink.done.wait(5), "a request did not end"
            assert (sink.finish, sink.error, sink.tokens) == ("length", None, expected_tokens(prompts[e], 12))
        assert pool.peer.stats.handoffs_in >= 4 and all(pool.back[e].handoffs >= 2 for e in ENTRIES)
        wait_for(lambda: not pool.peer_engine.held and not pool.peer.requests, "the peer kept KV")
        wait_for(lambda: pool.peer_transport.pinned("slm") == {10: 0, 20: 0}, "the peer kept a pin")
        for e in ENTRIES:
            wait_for(lambda e=e: not pool.engines[e].held and pool.transports[e].pinned("llm") == {PEER: 0},
                     f"entry {e} kept KV or a pin")
        assert pool.owners.active() == 0
    finally:
        pool.stop()


def test_a_lost_entry_s_requests_are_freed_at_the_peer_and_the_other_entry_s_go_on():
    pool = TwoEntries()
    try:
        lost = pool.submit(20, "20-0", [4, 3, 2], LONG)
        kept = pool.submit(10, "10-0", [1, 2, 3, 4], LONG)
        wait_for(lambda: "20-0" in pool.peer_engine.held and "10-0" in pool.peer_engine.held,
                 "the requests did not reach the peer")
        pool.out[20].deliver = pool.back[20].deliver = None  # entry 20's worker dies: nothing more from or to it
        pool.entries[20].stop()
        pool.peer_transport.instance_lost("slm", 20, "entry instance 20 is unreachable")  # what pool_member calls
        pool.owners.entry_lost(20)
        assert kept.done.wait(5) and (kept.finish, kept.tokens) == ("length", expected_tokens([1, 2, 3, 4], LONG))
        wait_for(lambda: not pool.peer_engine.held and not pool.peer.requests, "the peer kept the lost entry's KV")
        assert pool.peer_transport.pinned("slm") == {10: 0, 20: 0} and pool.owners.active() == 0
        assert not lost.done.is_set() or lost.finish == "error"  # (its client went with its worker)
    finally:
        pool.stop()

