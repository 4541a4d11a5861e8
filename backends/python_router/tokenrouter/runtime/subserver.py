"""One subserver per model: admission (entry only), the decoding loop, the pending table.

Everything that changes a request's state runs on this subserver's own loop thread; other threads
(clients, peers, Triton) only put events into the inbox. That keeps the hot path lock-free and
makes "no subserver ever waits for another's step" hold by construction.

Request lifecycle at one model: unknown -> here (runnable) -> away (pending: KV kept, skipped by
the scheduler) -> here (resumed as an extend of the tokens the peer committed) -> ... -> dropped.
The entry model owns the client side: admission, streaming, finish, cancel, and telling every
peer to release the request's KV.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable

from ..engine.base import Engine, StepResult, StepRow
from ..policies.base import RoutingPolicy
from .constraints import enforce_bad_words
from .messages import PeerMessage, RequestSpec
from .request import ClientSink, RequestError, RequestState, Submission, validate_submission
from .strategies import Strategy
from .transport import Transport

log = logging.getLogger(__name__)

TOMBSTONE_TTL_S = 120.0  # late messages for a released request are ignored this long


@dataclass
class StepRecord:
    start: float
    end: float
    rows: list[tuple[str, int]]  # (request id, tokens fed) per row

    @property
    def batch_size(self) -> int:
        return len(self.rows)


@dataclass
class SubserverStats:
    steps: int = 0
    tokens_committed: int = 0  # output tokens this model produced and committed
    handoffs_out: int = 0
    handoffs_in: int = 0
    finished: Counter = field(default_factory=Counter)  # entry only: finish reasons
    output_by_model: Counter = field(default_factory=Counter)  # entry only: output tokens per model index
    batch_sizes: Counter = field(default_factory=Counter)
    queue_wait_s: float = 0.0  # entry only: total time requests waited for admission
    busy_s: float = 0.0  # time spent inside engine steps


@dataclass
class Limits:
    max_model_len: int
    max_batch_size: int
    max_prefill_tokens: int
    max_wait_s: float
    max_active: int


class Subserver:
    def __init__(self, name: str, models: list[str], entry: str, engine: Engine, policy: RoutingPolicy,
                 transport: Transport, strategy: Strategy, limits: Limits,
                 threshold: Callable[[int], int] = lambda active: 1,
                 capacities: dict[str, tuple[int, int]] | None = None,
                 on_step: Callable[["Subserver", list[str], list[int], float | None], None] | None = None) -> None:
        """``threshold(N)`` gives B for this model at N active requests. ``capacities`` (entry
        only) maps every model to (total KV blocks, block size) for admission control.
        ``on_step(subserver, destinations, committed, latency_s)`` observes each routed step:
        where every row went, how many tokens it committed here, and the step latency (None
        for steps that prefilled or extended, whose cost is not a decode step's)."""
        self.name = name
        self.models = models
        self.index = models.index(name)
        self.entry = entry
        self.is_entry = name == entry
        self.peers = [m for m in models if m != name]
        self.engine = engine
        self.policy = policy
        self.transport = transport
        self.strategy = strategy
        self.limits = limits
        self.threshold = threshold
        self.on_step = on_step
        self.stats = SubserverStats()
        self.step_log: deque[StepRecord] = deque(maxlen=100_000)

        self.requests: dict[str, RequestState] = {}
        self.runnable: OrderedDict[str, None] = OrderedDict()  # FIFO of requests held here
        self.active = 0  # global N: counted by the entry, told to peers
        self._tombstones: dict[str, float] = {}
        self._inbox: queue.Queue = queue.Queue()

        # Entry-only client side.
        self._admission: deque[Submission] = deque()
        self._sinks: dict[str, ClientSink] = {}
        self._capacities = capacities or {}
        self._reserved = {model: 0 for model in self._capacities}
        self._reservations: dict[str, int] = {}

        self._stopped = False
        self._thread: threading.Thread | None = None
        strategy.register(self.has_work)

    # --- thread-safe entry points -----------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"subserver-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopped = True
        self.strategy.stop()
        self._inbox.put(("wake", None))
        if self._thread is not None:
            self._thread.join(timeout)

    def deliver(self, message: PeerMessage) -> None:
        self._put("message", message)

    def submit(self, rid: str, prompt_ids: list[int], spec: RequestSpec, sink: ClientSink) -> None:
        """Queue a client request (entry only). Raises RequestError for bad input, at once."""
        if not self.is_entry:
            raise RuntimeError(f"'{self.name}' is not the entry model ('{self.entry}' is)")
        validate_submission(prompt_ids, spec, max_model_len=self.limits.max_model_len,
                            vocab_size=self.engine.vocab_size)
        need = len(prompt_ids) + spec.max_tokens
        for model, (blocks, block_size) in self._capacities.items():
            if -(-need // block_size) > blocks:
                raise RequestError(f"the request needs {need} tokens of KV but model '{model}' holds "
                                   f"{blocks * block_size} in all")
        self._put("submit", Submission(rid, list(prompt_ids), spec, sink))

    def cancel(self, rid: str) -> None:
        self._put("cancel", rid)

    def fail(self, rid: str, error: str) -> None:
        """End a request with an error from outside the loop (e.g. its handoff could not be sent)."""
        self._put("fail", (rid, error))

    def has_work(self) -> bool:
        return bool(self.runnable) or not self._inbox.empty() or self._can_admit()

    def _put(self, kind: str, payload: object) -> None:
        self._inbox.put((kind, payload))
        self.strategy.notify_work()

    # --- the decoding loop ------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopped:
            self.strategy.start_round()
            if self._stopped:
                break
            self._drain(timeout=0.0)
            self._admit()
            batch = self._pick_batch()
            if batch:
                self.strategy.run_step(lambda: self._execute(batch))
            elif not self.strategy.lockstep:
                self._drain(timeout=self._idle_timeout())
            self._prune_tombstones()
        self._shutdown()

    def _idle_timeout(self) -> float:
        if not self.runnable:
            return 0.1
        oldest = min(self.requests[rid].ready_since for rid in self.runnable)
        return max(0.0, self.limits.max_wait_s - (time.monotonic() - oldest))

    def _drain(self, timeout: float) -> None:
        try:
            event = self._inbox.get(timeout=timeout) if timeout > 0 else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(*event)
            try:
                event = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, kind: str, payload) -> None:
        if kind == "message":
            self._on_message(payload)
        elif kind == "submit":
            self._admission.append(payload)
        elif kind == "cancel":
            self._on_cancel(payload)
        elif kind == "fail":
            rid, error = payload
            if rid in self.requests:
                self._finish(self.requests[rid], "error", error)

    def _pick_batch(self) -> list[tuple[RequestState, int]]:
        """(request, tokens to feed) for the next step, or [] to wait for more requests.

        Delayed batching: start only when at least B requests are ready, unless the oldest has
        waited max_wait (no starvation) or every active request is already here.
        """
        if not self.runnable:
            return []
        if self.strategy.uses_thresholds:
            need = min(self.threshold(max(self.active, 1)), max(self.active, 1))
            if len(self.runnable) < need and self._idle_timeout() > 0:
                return []
        batch, budget = [], self.limits.max_prefill_tokens
        for rid in self.runnable:
            if len(batch) == self.limits.max_batch_size:
                break
            request = self.requests[rid]
            pending = len(request.token_ids) - self.engine.num_cached(rid)
            if pending > 1:  # prefill/extend rows share a token budget; chunk what does not fit
                chunk = min(pending, budget) if batch else min(pending, self.limits.max_prefill_tokens)
                if chunk <= 0:
                    continue
                budget -= chunk
            else:
                chunk = pending
            batch.append((request, chunk))
        return batch

    def _execute(self, batch: list[tuple[RequestState, int]]) -> None:
        rows = []
        for request, chunk in batch:
            cached = self.engine.num_cached(request.rid)
            rows.append(StepRow(request.rid, request.token_ids[cached:cached + chunk], request.sampling))
        start = time.monotonic()
        try:
            result = self.engine.step(rows, return_hidden=self.policy.needs_hidden, top_logits=self.policy.top_logits)
        except Exception as exc:  # one bad step fails its requests, never the subserver
            log.exception("step failed on %s", self.name)
            for request, _ in batch:
                self._finish(request, "error", f"{type(exc).__name__} on {self.name}: {exc}")
            return
        end = time.monotonic()
        self.stats.steps += 1
        self.stats.busy_s += end - start
        self.stats.batch_sizes[len(rows)] += 1
        self.step_log.append(StepRecord(start, end, [(r.seq_id, len(r.new_tokens)) for r in rows]))

        # Only rows whose whole pending input went in predict a real next token (chunked prefill).
        done = [i for i, (request, _) in enumerate(batch)
                if self.engine.num_cached(request.rid) == len(request.token_ids)]
        if not done:
            return
        out = result if len(done) == len(rows) else _select_rows(result, done)
        out.sampled = out.sampled.clone()  # a normal tensor that policies may overwrite (ensembles)
        views = [batch[i][0] for i in done]
        enforce_bad_words(views, out)
        for view, token in zip(views, out.sampled.tolist()):
            view.sampled_token = token
        destinations = self._route(views, out)
        lengths = [len(view.token_ids) for view in views]
        for view, token, destination in zip(views, out.sampled.tolist(), destinations):
            view.sampled_token = token  # the policy may have replaced it (ensembles)
            if destination is None:
                continue  # the policy failed on this request; it is finished with the error
            if destination == self.name:
                self._commit(view, [token], [self.index])
            elif destination in self.peers:
                self._hand_off(view, destination)
            else:
                self._finish(view, "error", f"policy '{self.policy.name}' routed to unknown model '{destination}'")
        if self.on_step is not None:
            committed = [len(view.token_ids) - before for view, before in zip(views, lengths)]
            decode_only = all(len(row.new_tokens) == 1 for row in rows)
            self.on_step(self, destinations, committed, end - start if decode_only else None)

    def _route(self, views: list[RequestState], out: StepResult) -> list[str | None]:
        """The policy's destinations. When it raises on a batch, route row by row so that only the
        requests it fails on end (with the error); ``None`` marks those."""
        try:
            return self.policy.route(views, out)
        except Exception:
            log.exception("policy %s failed on a batch of %d on %s", self.policy.name, len(views), self.name)
        destinations: list[str | None] = []
        for row, view in enumerate(views):
            single = _select_rows(out, [row])
            try:
                destinations.append(self.policy.route([view], single)[0])
                out.sampled[row] = single.sampled[0]
            except Exception as exc:
                destinations.append(None)
                self._finish(view, "error", f"policy '{self.policy.name}' failed: {type(exc).__name__}: {exc}")
        return destinations

    # --- commits, handoffs, finishing ---------------------------------------------------------------
    def _commit(self, request: RequestState, tokens: list[int], origins: list[int], *,
                inform_entry: bool = True) -> bool:
        """This model (the holder) commits tokens. Returns True when that ended the request.

        A peer keeps the entry informed with progress messages so the client sees tokens while
        the request stays away; a handoff carries its own tokens (``inform_entry=False``).
        """
        request.commit(tokens, origins)
        request.sampled_token = None
        self.stats.tokens_committed += len(tokens)
        reason = request.finish_reason(self.limits.max_model_len)
        if self.is_entry:
            self._emit(request.rid, tokens, origins, reason)
        if reason is not None:
            self._finish(request, reason, notified=True)
            return True
        if inform_entry and not self.is_entry:
            self._send_suffix(request, self.entry, "progress")
        return False

    def _hand_off(self, request: RequestState, peer: str) -> None:
        message = self.policy.send(request, peer)
        kept = message.anchor + len(message.tokens) > len(request.token_ids)
        # A kept sampled token is committed here (attributed to this model) and may end the request.
        if kept and self._commit(request, [request.sampled_token], [self.index], inform_entry=False):
            return
        request.sampled_token = None
        message.kind, message.sender, message.active = "handoff", self.name, self.active
        request.known[peer] = message.anchor + len(message.tokens)
        request.here = False
        self.runnable.pop(request.rid, None)
        self.stats.handoffs_out += 1
        self.transport.send(peer, message)

    def _send_suffix(self, request: RequestState, peer: str, kind: str, reason: str | None = None,
                     error: str | None = None) -> None:
        anchor = request.known.get(peer, 0)
        origins = [-1] * request.prompt_len + request.origins
        self.transport.send(peer, PeerMessage(
            kind=kind, rid=request.rid, sender=self.name, anchor=anchor, tokens=request.token_ids[anchor:],
            origins=origins[anchor:], finish_reason=reason, state={"error": error} if error else {}))
        request.known[peer] = len(request.token_ids)

    def _finish(self, request: RequestState, reason: str, error: str | None = None, *,
                notified: bool = False) -> None:
        if self.is_entry:
            self._finalize(request.rid, reason, error, notified=notified)
        else:
            self._send_suffix(request, self.entry, "finish", reason, error)
            self._drop(request.rid)

    def _finalize(self, rid: str, reason: str, error: str | None = None, *, notified: bool = False) -> None:
        """Entry: the request is over. Tell the client (unless its last output already said so),
        free KV everywhere, admit the next one."""
        if not notified:
            self._emit(rid, [], [], reason, error)
        self._sinks.pop(rid, None)
        self.stats.finished[reason] += 1
        self._drop(rid)
        for peer in self.peers:
            self.transport.send(peer, PeerMessage(kind="release", rid=rid, sender=self.name))
        for model, blocks in (self._reservations.pop(rid, None) or {}).items():
            self._reserved[model] -= blocks
        self.active -= 1
        self._broadcast_active()

    def _drop(self, rid: str) -> None:
        self.requests.pop(rid, None)
        self.runnable.pop(rid, None)
        self.engine.release(rid)
        self._tombstones[rid] = time.monotonic()

    # --- messages from peers ------------------------------------------------------------------------
    def _on_message(self, message: PeerMessage) -> None:
        if message.active is not None and not self.is_entry:
            self.active = message.active
        if message.kind == "active":
            return
        if message.rid in self._tombstones:
            return  # a late message for a request that is already over
        if message.kind == "release":
            self._drop(message.rid)
            return
        request = self.requests.get(message.rid)
        if request is None:
            if message.kind != "handoff" or message.request is None or self.is_entry:
                log.warning("%s: ignoring %s for unknown request %s", self.name, message.kind, message.rid)
                return
            request = self._first_visit(message)
        if message.kind == "handoff":
            self.stats.handoffs_in += 1
            tokens = self.policy.receive(request, message)
            self._apply_suffix(request, message.anchor, tokens, message.origins[:len(tokens)], None)
            request.state = dict(message.state)
            request.known[message.sender] = message.anchor + len(message.tokens)
            request.here = True
            request.ready_since = time.monotonic()
            self.runnable[request.rid] = None
        elif message.kind in ("progress", "finish") and self.is_entry:
            reason = (message.finish_reason or "error") if message.kind == "finish" else None
            self._apply_suffix(request, message.anchor, message.tokens, message.origins, reason,
                               message.state.get("error"))
            request.known[message.sender] = message.anchor + len(message.tokens)
            if reason is not None:
                self._finalize(request.rid, reason, notified=True)

    def _first_visit(self, message: PeerMessage) -> RequestState:
        spec = message.request
        request = RequestState(rid=message.rid, model=self.name, model_index=self.index, token_ids=[],
                               prompt_len=spec.prompt_len, origins=[], spec=spec)
        self.engine.add_sequence(message.rid)
        self.requests[message.rid] = request
        return request

    def _apply_suffix(self, request: RequestState, anchor: int, tokens: list[int], origins: list[int],
                      reason: str | None, error: str | None = None) -> None:
        """Take a peer's newer context; the entry streams what is new (with the finish, if any)."""
        grown = request.apply_suffix(anchor, tokens, origins)
        if self.is_entry and (grown > 0 or reason is not None):
            new_tokens = request.token_ids[len(request.token_ids) - grown:]
            new_origins = request.origins[len(request.origins) - grown:]
            self._emit(request.rid, new_tokens, new_origins, reason, error)

    def _emit(self, rid: str, tokens: list[int], origins: list[int], reason: str | None = None,
              error: str | None = None) -> None:
        """Hand output to the client's sink. A failing sink (a client gone away) cancels that
        request only; it must never take the decoding loop down."""
        sink = self._sinks.get(rid)
        if sink is None:
            return
        self.stats.output_by_model.update(origins)
        try:
            sink.on_output(tokens, origins, reason, error)
        except Exception:
            log.exception("%s: the client sink of %s failed; cancelling it", self.name, rid)
            if reason is None:
                self._inbox.put(("cancel", rid))

    # --- admission and cancellation (entry) ---------------------------------------------------------
    def _can_admit(self) -> bool:
        return self.is_entry and bool(self._admission) and self.active < self.limits.max_active

    def _admit(self) -> None:
        while self._can_admit():
            submission = self._admission[0]
            need = {model: -(-(len(submission.prompt_ids) + submission.spec.max_tokens) // block_size)
                    for model, (_, block_size) in self._capacities.items()}
            if any(self._reserved[m] + need[m] > self._capacities[m][0] for m in need):
                return  # wait until finished requests free enough KV on every model
            self._admission.popleft()
            for model, blocks in need.items():
                self._reserved[model] += blocks
            self._reservations[submission.rid] = need
            self.stats.queue_wait_s += time.monotonic() - submission.submitted_at
            request = RequestState(rid=submission.rid, model=self.name, model_index=self.index,
                                   token_ids=list(submission.prompt_ids), prompt_len=len(submission.prompt_ids),
                                   origins=[], spec=submission.spec, here=True)
            self.engine.add_sequence(submission.rid)
            self.requests[submission.rid] = request
            self._sinks[submission.rid] = submission.sink
            self.runnable[submission.rid] = None
            self.active += 1
            self._broadcast_active()

    def _broadcast_active(self) -> None:
        for peer in self.peers:
            self.transport.send(peer, PeerMessage(kind="active", rid="", sender=self.name, active=self.active))

    def _on_cancel(self, rid: str) -> None:
        for submission in self._admission:
            if submission.rid == rid:
                self._admission.remove(submission)
                submission.sink.on_output([], [], "cancelled")
                self.stats.finished["cancelled"] += 1
                return
        if rid in self.requests:
            self._finalize(rid, "cancelled")

    def _prune_tombstones(self) -> None:
        horizon = time.monotonic() - TOMBSTONE_TTL_S
        if not self._tombstones or next(iter(self._tombstones.values())) >= horizon:
            return  # insertion order = age order: nothing old enough yet
        for rid in [rid for rid, at in self._tombstones.items() if at < horizon]:
            del self._tombstones[rid]

    def _shutdown(self) -> None:
        """Fail whatever is still in flight so no client waits forever."""
        if self.is_entry:
            for submission in list(self._admission):
                submission.sink.on_output([], [], "error", "the server is shutting down")
            self._admission.clear()
            for rid in list(self.requests):
                self._finalize(rid, "error", "the server is shutting down")
        for rid in list(self.requests):
            self._drop(rid)


def _select_rows(result: StepResult, rows: list[int]) -> StepResult:
    def pick(tensor):
        return None if tensor is None else tensor[rows]

    return StepResult(seq_ids=[result.seq_ids[i] for i in rows], sampled=result.sampled[rows].clone(),
                      logits=pick(result.logits), positions=pick(result.positions), hidden=pick(result.hidden),
                      topk_values=pick(result.topk_values), topk_indices=pick(result.topk_indices))
