"""The subserver core driven synchronously (events in, effects out, no thread, engine or clock): a core
on two models "a" and "b" with a scripted policy, a sink that collects what it emits, and engine steps."""

from __future__ import annotations

from typing import Sequence

import torch

from tokenrouter.engine.base import StepResult
from tokenrouter.protocol import PeerMessage, RequestView, Route
from tokenrouter.runtime.core import Limits, SubserverCore
from tokenrouter.runtime.effects import Batch, Emit

VOCAB = 16


class Sink:
    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.origins: list[int] = []
        self.finish: str | None = None
        self.error: str | None = None

    def on_output(self, tokens, origins, finish_reason=None, error=None, logprobs=None) -> None:
        self.tokens += tokens
        self.origins += origins
        self.finish, self.error = finish_reason, error


class Scripted:
    """A policy whose destinations are set per (model, rid) by the test; default: stay."""

    name = "scripted"
    needs_hidden = False
    top_logits = 0
    needs_logits = False

    def __init__(self, keep_sampled: bool = False) -> None:
        self.plan: dict[tuple[str, str], str] = {}
        self.keep_sampled = keep_sampled
        self.fail_on: set[str] = set()

    def route(self, batch: Sequence[RequestView], out) -> list[str | Route]:
        if any(view.rid in self.fail_on for view in batch):
            raise RuntimeError("scripted failure")
        return [self.plan.get((view.model, view.rid), view.model) for view in batch]

    def send(self, request: RequestView, peer: str) -> PeerMessage:
        return request.message_to(peer, keep_sampled=self.keep_sampled)

    def receive(self, request: RequestView, message: PeerMessage) -> list[int]:
        return list(message.tokens)


def core(name: str = "a", *, policy=None, threshold=lambda n: 1, capacities=None, max_batch_size=8,
         max_prefill_tokens=64, max_wait_s=1.0, max_active=4, max_model_len=64, max_queue=64, queue_timeout_s=0.0,
         max_bypass=0) -> SubserverCore:
    limits = Limits(max_batch_size=max_batch_size, max_prefill_tokens=max_prefill_tokens, max_wait_s=max_wait_s,
                    max_model_len=max_model_len, max_active=max_active, max_queue=max_queue,
                    queue_timeout_s=queue_timeout_s, max_bypass=max_bypass)
    return SubserverCore(name, ["a", "b"], "a", policy or Scripted(), limits, threshold=threshold,
                         capacities=capacities if capacities is not None else {"a": (64, 4), "b": (64, 4)})


def run(effects) -> list:
    """Perform Emit effects on their sinks (what the loop does); return all effects."""
    for effect in effects:
        if isinstance(effect, Emit):
            effect.sink.on_output(effect.tokens, effect.origins, effect.finish_reason, effect.error)
    return effects


def step(c: SubserverCore, batch: Batch, tokens: Sequence[int], now: float = 0.0) -> list:
    """The engine ran ``batch`` and sampled ``tokens`` (one per row)."""
    result = StepResult(seq_ids=batch.rids, sampled=torch.tensor(list(tokens)), logits=torch.zeros(len(tokens), VOCAB),
                        positions=torch.zeros(len(tokens), dtype=torch.long))
    return run(c.on_step(batch, result, now))
