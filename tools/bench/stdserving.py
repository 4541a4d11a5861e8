"""Std. Serving: token-level routing on plain serving engines, driven from outside.

The baseline the TokenRouter paper compares with: one ordinary serving engine per model, and an
external dispatcher per client request that asks the current model for exactly one token per call
(sending the whole context) and applies the routing policy between calls.

- ``PlainServer`` serves one model: every call is one row of the next engine step (continuous
  batching: a step takes whatever calls are queued), with a prefix cache that reuses the KV of
  earlier calls (``PrefixCache``). It has no notion of a request that is away at another model:
  between calls a conversation is just a cache entry that may be evicted.
- The dispatcher is ``runtime.reference.reference_generate``, the naive per-request routing loop,
  with each "recompute the context" call answered by a plain server. So the routing decisions,
  committed tokens and attributions are the policy's own, as in the served runtime.

Built on the Engine API, so it runs on the simulated and the real engines alike. What it costs
over TokenRouter is what this implementation costs: queueing one call per token, hashing and
matching the context per call, and batches that re-form from whichever calls happen to be queued.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import torch

from tokenrouter.engine.base import Engine, SamplingParams, StepRow
from tokenrouter.policies.base import RoutingPolicy
from tokenrouter.protocol import RequestSpec
from tokenrouter.runtime.reference import FullRecompute, reference_generate
from tokenrouter.text import TextCodec

from .prefix_cache import PrefixCache
from .records import Prompt, RequestRecord
from .targets import Spans


@dataclass
class _Call:
    tokens: list[int]
    done: threading.Event = field(default_factory=threading.Event)
    logits: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    error: BaseException | None = None


class PlainServer:
    """One model behind a call queue: ``forward(context)`` -> next-token (logits, hidden)."""

    def __init__(self, name: str, engine: Engine, *, max_batch_size: int, max_prefill_tokens: int,
                 return_hidden: bool = False) -> None:
        self.name, self.engine = name, engine
        self.max_batch_size, self.max_prefill_tokens = max_batch_size, max_prefill_tokens
        self.return_hidden = return_hidden
        self.cache = PrefixCache(engine.block_size)
        self.step_log: list[tuple[float, float]] = []
        self.batch_sizes: list[int] = []
        self.bookkeeping_s = 0.0  # forming batches, prefix matching, eviction, cache updates
        self._queue: deque[_Call] = deque()
        self._ready = threading.Condition()
        self._ids = itertools.count()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=f"plain-{name}", daemon=True)
        self._thread.start()

    def forward(self, tokens: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One token's worth of work for this context (a FullRecompute, served); blocks."""
        call = _Call(list(tokens))
        with self._ready:
            if self._stopped:
                raise RuntimeError(f"plain server '{self.name}' is stopped")
            self._queue.append(call)
            self._ready.notify()
        call.done.wait()
        if call.error is not None:
            raise call.error
        return call.logits, call.hidden

    def close(self) -> None:
        with self._ready:
            self._stopped = True
            self._ready.notify()
        self._thread.join(timeout=30)
        for seq_id in self.cache.clear():
            self.engine.release(seq_id)

    # --- the serving loop (one thread) -----------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._stopped:
                    self._ready.wait()
                if self._stopped:
                    for call in self._queue:
                        call.error = RuntimeError(f"plain server '{self.name}' stopped")
                        call.done.set()
                    return
            started = time.perf_counter()
            batch = self._form_batch()
            self.bookkeeping_s += time.perf_counter() - started
            if batch:
                self._step(batch)

    def _form_batch(self) -> list[tuple[_Call, object, int]]:
        """Queued calls in arrival order, each placed on a sequence: (call, seq id, cached tokens)."""
        batch: list[tuple[_Call, object, int]] = []
        budget = self.max_prefill_tokens
        while len(batch) < self.max_batch_size:
            with self._ready:
                if not self._queue:
                    break
                call = self._queue[0]
            placed = self._place(call.tokens, budget if batch else None)
            if placed is None:
                if not batch:  # alone and still no room: the pool cannot hold this context at all
                    with self._ready:
                        self._queue.popleft()
                    call.error = RuntimeError(f"'{self.name}': {len(call.tokens)} tokens do not fit the KV pool")
                    call.done.set()
                    continue
                break
            with self._ready:
                self._queue.popleft()
            seq_id, cached = placed
            budget -= len(call.tokens) - cached
            batch.append((call, seq_id, cached))
        return batch

    def _place(self, tokens: list[int], budget: int | None) -> tuple[object, int] | None:
        """A sequence holding the longest cached prefix (or a new one), with KV room for the rest;
        None when the new tokens exceed ``budget`` or the pool has no room even after eviction."""
        hit = self.cache.take(tokens)
        seq_id, cached = hit if hit is not None else (f"{self.name}-{next(self._ids)}", 0)
        if budget is not None and len(tokens) - cached > budget:
            self._give_back(seq_id, tokens[:cached], hit is not None)
            return None
        engine = self.engine
        need = engine.blocks_for(len(tokens)) - engine.blocks_for(cached)
        while engine.num_free_blocks < need:
            victim = self.cache.evict()
            if victim is None:
                self._give_back(seq_id, tokens[:cached], hit is not None)
                return None
            engine.release(victim)
        if hit is None:
            engine.add_sequence(seq_id)
        return seq_id, cached

    def _give_back(self, seq_id: object, content: list[int], cached: bool) -> None:
        if cached:
            self.cache.insert(seq_id, content)

    def _step(self, batch: list[tuple[_Call, object, int]]) -> None:
        rows = [StepRow(seq_id, call.tokens[cached:], SamplingParams()) for call, seq_id, cached in batch]
        start = time.monotonic()
        try:
            result = self.engine.step(rows, return_hidden=self.return_hidden)
        except Exception as exc:  # fail these calls; their sequences hold unknown state: drop them
            for call, seq_id, _ in batch:
                self.engine.release(seq_id)
                call.error = exc
                call.done.set()
            return
        end = time.monotonic()
        self.step_log.append((start, end))
        self.batch_sizes.append(len(rows))
        for i, (call, seq_id, _) in enumerate(batch):
            call.logits = result.require_logits()[i]
            call.hidden = result.hidden[i] if result.hidden is not None else None
            self.cache.insert(seq_id, call.tokens)  # its KV now covers the whole context
            call.done.set()
        self.bookkeeping_s += time.monotonic() - end

    def report(self) -> dict[str, Any]:
        """Prefix-cache counters, and per step: rows, engine time, bookkeeping time."""
        steps = max(1, len(self.step_log))
        return {**asdict(self.cache.stats), "steps": len(self.step_log),
                "mean_batch": sum(self.batch_sizes) / steps,
                "step_ms": 1e3 * sum(end - start for start, end in self.step_log) / steps,
                "bookkeeping_ms_per_step": 1e3 * self.bookkeeping_s / steps}


class _Cut(Exception):
    """The measurement window ended while the request was running."""


class StdServingTarget:
    """Plain servers for every model plus a dispatcher per request (on the client's thread)."""

    def __init__(self, engines: dict[str, Engine], policy: RoutingPolicy, *, large: str, max_model_len: int,
                 max_batch_size: int, max_prefill_tokens: int, codec: TextCodec | None = None) -> None:
        self.policy, self.large, self.codec, self.max_model_len = policy, large, codec, max_model_len
        self.entry = policy.entry
        self.names = list(engines)
        self.servers = {name: PlainServer(name, engine, max_batch_size=max_batch_size,
                                          max_prefill_tokens=max_prefill_tokens, return_hidden=policy.needs_hidden)
                        for name, engine in engines.items()}
        eos = engines[self.entry].eos_token_ids
        self.end_ids = codec.end_ids(eos) if codec else sorted(eos)

    def generate(self, prompt: Prompt, *, max_tokens: int, seed: int, deadline: float) -> RequestRecord:
        return dispatch({name: server.forward for name, server in self.servers.items()}, self.policy, self.entry,
                        prompt, codec=self.codec, end_ids=self.end_ids, max_model_len=self.max_model_len,
                        max_tokens=max_tokens, seed=seed, deadline=deadline)

    def step_spans(self) -> Spans:
        return {name: list(server.step_log) for name, server in self.servers.items()}

    def close(self) -> None:
        for server in self.servers.values():
            server.close()


def dispatch(models: dict[str, FullRecompute], policy: RoutingPolicy, entry: str, prompt: Prompt, *,
             codec: TextCodec | None, end_ids: list[int], max_model_len: int, max_tokens: int, seed: int,
             deadline: float) -> RequestRecord:
    """The external dispatcher of one request: ``reference_generate`` with each "recompute the context"
    answered by ``models[name]`` (one call per token), the tokens stamped as the calls return."""
    record = RequestRecord()
    names = list(models)
    ids: list[int]
    if isinstance(prompt, str):
        if codec is None:
            record.finish("error", [], "a text prompt needs a tokenizer; this dispatcher has none")
            return record
        ids = codec.encode_prompt(prompt)
    else:
        ids = list(prompt)
    spec = RequestSpec(prompt_len=len(ids), max_tokens=max_tokens, seed=seed, end_ids=end_ids)
    # Tokens committed after a call were written by that call's model (the dispatcher commits
    # the sampled token of the model it just called): stamp them when the next call goes out.
    last_length, last_model = len(ids), entry

    def served(name: str) -> FullRecompute:
        def forward(tokens: list[int]):
            nonlocal last_length, last_model
            record.add(len(tokens) - last_length, [last_model] * (len(tokens) - last_length))
            last_length, last_model = len(tokens), name
            if time.monotonic() >= deadline:
                raise _Cut
            return models[name](tokens)
        return forward

    try:
        output, origins, reason = reference_generate({name: served(name) for name in names}, policy, entry, ids,
                                                     spec, max_model_len=max_model_len)
    except _Cut:
        record.finish("cancelled", [])
        return record
    except Exception as exc:
        record.finish("error", [], f"{type(exc).__name__}: {exc}")
        return record
    done = len(ids) + len(output) - last_length
    record.add(done, [names[o] for o in origins[len(origins) - done:]])
    record.finish(reason, codec.decode(output) if codec is not None and isinstance(prompt, str) else output)
    return record
