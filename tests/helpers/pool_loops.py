"""The real pieces of a split pair's pools in one process, for tests that run subserver loops without
servers: small in-test engines whose token is a function of how much context the sequence holds (so a
request's output is known without running it, and only an instance that prefilled the whole context
writes the right one), a policy that hands every third position to the large model, and links that
carry messages in process (test_pool_move.py, test_entry_pool_loops.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from tokenrouter.engine.base import StepResult
from tokenrouter.protocol import PeerMessage, RequestView
from tokenrouter.runtime.core import Limits
from tokenrouter.serving.subserver.sending_session import UP

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


def expected_tokens(prompt: list[int], max_tokens: int) -> list[int]:
    """What every request of ``prompt`` writes, whichever model writes each token."""
    return [token_at(length) for length in range(len(prompt), len(prompt) + max_tokens)]
