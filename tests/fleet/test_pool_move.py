"""A request whose large-model instance is lost goes on at another instance, through the real pieces:
the entry's subserver loop and its PinnedTransport, two peer subserver loops of the large model (the
pool's instances), and links that carry the messages in process (the lost instance's takes them and
answers nothing, as a killed worker does). Engines are small in-test ones (no weights, no server).

The engines' token is a function of how much context the sequence holds, on both models, so the
request's output is known without running it, and only an instance that prefilled the whole context
writes the right one."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from tokenrouter.engine.base import StepResult
from tokenrouter.fleet.pinned_transport import PinnedTransport
from tokenrouter.protocol import PeerMessage, RequestSpec, RequestView
from tokenrouter.runtime.core import Limits, SubserverCore
from tokenrouter.runtime.strategies import Strategy
from tokenrouter.runtime.subserver import Subserver
from tokenrouter.runtime.transport import InProcessTransport
from tokenrouter.serving.subserver.sending_session import CONNECTING, UP

from helpers.done_sink import DoneSink

PROMPT = [1, 2, 3, 4]
MAX_TOKENS = 12
LIMITS = Limits(max_batch_size=4, max_prefill_tokens=64, max_wait_s=0.01, max_model_len=64, max_active=4,
                max_queue=8, queue_timeout_s=0, max_bypass=0)


def token_at(length: int) -> int:
    """The token every engine samples after a context of ``length`` tokens."""
    return length % 5 + 1


class PositionEngine:
    vocab_size = 8

    def __init__(self) -> None:
        self.held: dict[str, int] = {}  # sequence -> context tokens it holds KV for

    def has_sequence(self, rid: str) -> bool:
        return rid in self.held

    def add_sequence(self, rid: str) -> None:
        self.held[rid] = 0

    def release(self, rid: str) -> bool:
        return self.held.pop(rid, None) is not None

    def step(self, rows, *, return_hidden=False, top_logits=0, return_logits=True) -> StepResult:
        for row in rows:
            self.held[row.seq_id] += len(row.new_tokens)
        sampled = torch.tensor([token_at(self.held[row.seq_id]) for row in rows])
        return StepResult(seq_ids=[r.seq_id for r in rows], sampled=sampled, logits=torch.zeros(len(rows), 8),
                          positions=torch.zeros(len(rows), dtype=torch.long))


class EveryThirdToTheLarge:
    """The entry hands a position to the large model when the context length is a multiple of 3 (the
    large model writes it); the large model hands back after that one token."""

    name, needs_hidden, top_logits, needs_logits = "every-third", False, 0, False

    def route(self, batch: Sequence[RequestView], out) -> list[str]:
        return ["llm" if view.model == "slm" and len(view.token_ids) % 3 == 0 else "slm" for view in batch]

    def send(self, request: RequestView, peer: str) -> PeerMessage:
        return request.message_to(peer, keep_sampled=peer == "slm")

    def receive(self, request: RequestView, message: PeerMessage) -> list[int]:
        return list(message.tokens)


class Link:
    """An instance's link as the transport sees it; ``deliver`` None: its worker is dead (it takes
    the messages and answers nothing)."""

    state = UP
    problem = None

    def __init__(self, deliver: Callable[[PeerMessage], None] | None) -> None:
        self.deliver = deliver
        self.handoffs = 0

    def send(self, messages: Sequence[PeerMessage]) -> None:
        self.handoffs += sum(m.kind == "handoff" for m in messages)
        for message in messages if self.deliver else ():
            self.deliver(PeerMessage.from_json(message.to_json()))

    def close(self) -> None:
        pass


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 5
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


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
        expected = [token_at(length) for length in range(len(PROMPT), len(PROMPT) + MAX_TOKENS)]
        assert (sink.finish, sink.error, sink.tokens) == ("length", None, expected)
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
