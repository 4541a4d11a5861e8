"""The subserver core: one model's scheduling decisions, synchronous and thread-free.

After vLLM v1's ``schedule()`` / ``update_from_output()``: events go in (``submit``, ``on_message``,
``cancel``, ``fail``, ``tick``, ``schedule`` then ``on_step`` / ``on_step_failed``), effects come out
(``effects.py``: send a message, emit to a client, release KV, report a routed step). The core owns
no queue, thread or clock: the caller passes ``now`` and performs the effects in order. The loop
around it (``subserver.py``) owns the inbox, the thread and the strategy hooks; unit tests drive
the core directly (``tests/runtime/test_core.py``).

Request lifecycle at one model: unknown -> here (runnable) -> away (pending: KV kept, skipped by
the scheduler) -> here (resumed as an extend of the tokens the peer committed) -> ... -> released.
A request ends in one of three ways: it finishes (a stop rule: length, end id, stop sequence,
context limit), the client cancels it, or an error fails it; every model then releases it (frees
its KV and forgets it). What differs between the entry model and a peer lives in ``roles.py``.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable

from ..engine.base import StepResult, StepRow
from ..protocol import PeerMessage, Policy, Route
from .admission import QueueLimits
from .batching import BatchLimits, batch_due, select_rows, wait_left
from .constraints import enforce_bad_words
from .effects import Batch, Effect, Release, Routed, Send
from .handoff import accept_handoff, handoff_problem, stamp_handoff
from .request import RequestState, Submission
from .roles import EntryRole, PeerRole
from .routing import record_log_probs, route_rows, select_result_rows

log = logging.getLogger(__name__)

TOMBSTONE_TTL_S = 120.0  # late messages for a released request are ignored this long
QUEUE_WAITS_KEPT = 4096  # admissions between two metric updates (0.5 s) before the oldest waits are lost


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
    # entry only: each admitted request's wait, for the metrics thread to take (it pops them);
    # bounded, so nothing grows when no one reads them (the embedded API)
    queue_waits: deque = field(default_factory=lambda: deque(maxlen=QUEUE_WAITS_KEPT))
    queue_timeouts: int = 0  # entry only: requests that waited longer than queue_timeout_s
    refused_busy: int = 0  # entry only: requests refused because the queue was full
    busy_s: float = 0.0  # time spent inside engine steps (the loop measures it)
    dropped_messages: Counter = field(default_factory=Counter)  # peer messages that did not fit, by reason


@dataclass(frozen=True, kw_only=True)
class Limits(BatchLimits, QueueLimits):
    max_model_len: int  # prompt + output cap


class SubserverCore:
    def __init__(self, name: str, models: list[str], entry: str, policy: Policy, limits: Limits,
                 threshold: Callable[[int], int] = lambda active: 1,
                 capacities: dict[str, tuple[int, int]] | None = None) -> None:
        """``threshold(N)`` gives the delayed-batching B at N active requests (1: no delay).
        ``capacities`` (entry only) maps every model to (total KV blocks, block size)."""
        self.name, self.models, self.entry = name, list(models), entry
        self.index = self.models.index(name)
        self.peers = [m for m in self.models if m != name]
        self.policy, self.limits, self.threshold = policy, limits, threshold
        self.stats = SubserverStats()
        self.requests: dict[str, RequestState] = {}
        self.runnable: OrderedDict[str, None] = OrderedDict()  # FIFO of requests held here
        self.active = 0  # global N: counted by the entry, told to peers
        self.tombstones: dict[str, float] = {}
        self.now = 0.0  # the time of the event being handled (the caller's clock)
        self.role = EntryRole(self, capacities or {}) if name == entry else PeerRole(self)

    # --- events ---------------------------------------------------------------------------------------
    def validate(self, prompt_ids: list[int], spec, vocab_size: int) -> None:
        """Raise RequestError for a request that cannot run; reads only fixed limits (any thread)."""
        self.role.validate(prompt_ids, spec, vocab_size)

    def check_room(self, in_transit: int = 0) -> None:
        """Raise ServerBusy when the admission queue is full (counting ``in_transit`` submissions
        not queued yet). Reads only the queue's length: safe from another thread."""
        self.role.check_room(in_transit)

    @property
    def queued(self) -> int:
        """Submissions waiting for admission (any thread may read it)."""
        return self.role.queued()

    def submit(self, submission: Submission, now: float) -> list[Effect]:
        self.now = now
        return self.role.submit(submission)

    def cancel(self, rid: str, now: float) -> list[Effect]:
        self.now = now
        return self.role.cancel(rid)

    def fail(self, rid: str, error: str, now: float) -> list[Effect]:
        """End a request with an error from outside (e.g. its handoff could not be delivered)."""
        self.now = now
        fx: list[Effect] = []
        if rid in self.requests:
            self._fail(self.requests[rid], error, fx)
        return fx

    def peer_lost(self, peer: str, error: str, now: float) -> list[Effect]:
        """``peer`` cannot be reached (its server died, the network dropped): end every request that
        cannot go on without it, with ``error``; their KV here is released."""
        self.now = now
        fx: list[Effect] = []
        self.role.on_peer_lost(peer, error, fx)
        return fx

    def peer_forgot(self, rid: str, peer: str, now: float) -> list[Effect]:
        """``peer`` holds nothing of ``rid`` any more: the instance of that model that held its KV is gone,
        and another instance of the same model takes the request. What ``peer`` had seen is forgotten, so
        the next handoff there is a first visit (the whole context, anchor 0, the request's spec); a
        request away there now is handed off so at once. The tokens the lost instance sent back and this
        model accepted stay (greedy: the new instance would write the same ones)."""
        self.now = now
        fx: list[Effect] = []
        request = self.requests.get(rid)
        if request is None:
            return fx  # over already
        request.known.pop(peer, None)
        if not request.here and request.sent_to == peer:
            self._hand_off(request, peer, None, fx)
        return fx

    def away_at(self, peer: str) -> list[RequestState]:
        """The requests this model handed to ``peer`` last and does not hold now."""
        return [r for r in self.requests.values() if not r.here and r.sent_to == peer]

    def tick(self, now: float) -> list[Effect]:
        """End submissions that waited too long, admit what fits and forget old tombstones; call
        before every ``schedule``."""
        self.now = now
        self._prune_tombstones()
        return self.role.admit()

    def on_message(self, message: PeerMessage, now: float) -> list[Effect]:
        """A peer's message. Total: one that does not fit is dropped and counted, never raised."""
        self.now = now
        fx: list[Effect] = []
        try:
            self._on_message(message, fx)
        except Exception as exc:  # a bug's last guard: the loop must survive any one message
            log.exception("%s: %s for %s failed", self.name, message.kind, message.rid)
            self.drop_message(message, f"{type(exc).__name__}: {exc}")
        return fx

    def shutdown(self, reason: str) -> list[Effect]:
        """Fail whatever is still in flight so no client waits forever."""
        fx = self.role.shutdown(reason)
        for rid in list(self.requests):
            self.release(rid, fx)
        return fx

    # --- scheduling -----------------------------------------------------------------------------------
    def schedule(self, now: float) -> Batch | None:
        """The next step, or None to wait (nothing runnable, or delayed batching holds it back)."""
        self.now = now
        ready = [self.requests[rid] for rid in self.runnable]
        if not ready:
            return None
        active = max(self.active, 1)
        waited = now - ready[0].ready_since
        if not batch_due(len(ready), active, self.threshold(active), waited, self.limits.max_wait_s):
            return None
        selected = select_rows(ready, self.limits)
        if not selected:
            return None
        rows = [StepRow(r.rid, r.token_ids[r.cached:r.cached + chunk], r.sampling) for r, chunk in selected]
        # The policy's reads, and bad words (masked in the logits, then resampled); the engine adds
        # the rows whose own sampling reads the whole row (engine.base.full_logits_needed).
        return Batch(rows, needs_logits=self.policy.needs_logits or any(r.spec.bad_sequences for r, _ in selected))

    def wait_left(self, now: float) -> float | None:
        """Seconds until delayed batching must start a step anyway; None with nothing runnable."""
        oldest = next(iter(self.runnable), None)
        return wait_left(None if oldest is None else self.requests[oldest].ready_since, now, self.limits.max_wait_s)

    def has_work(self) -> bool:
        return bool(self.runnable) or self.role.can_admit()

    def on_step_failed(self, batch: Batch, error: str, now: float) -> list[Effect]:
        self.now = now
        fx: list[Effect] = []
        for rid in batch.rids:
            if rid in self.requests:
                self._fail(self.requests[rid], error, fx)
        return fx

    def on_step(self, batch: Batch, result: StepResult, now: float) -> list[Effect]:
        """The engine ran ``batch``: advance each row's KV, route the rows that predicted a token."""
        self.now = now
        fx: list[Effect] = []
        self.stats.steps += 1
        self.stats.batch_sizes[len(batch.rows)] += 1
        done = []
        for i, row in enumerate(batch.rows):
            request = self.requests.get(row.seq_id)
            if request is None:
                continue  # ended while its step ran; its KV is already released
            request.cached += len(row.new_tokens)
            # Only rows whose whole pending input went in predict a real next token (chunked prefill).
            if request.cached == len(request.token_ids):
                done.append(i)
        if not done:
            return fx
        out = result if len(done) == len(batch.rows) else select_result_rows(result, done)
        out.sampled = out.sampled.clone()  # engine outputs may be inference tensors
        requests = [self.requests[batch.rows[i].seq_id] for i in done]
        exhausted = enforce_bad_words(requests, out)
        if exhausted:
            for i in exhausted:
                self._fail(requests[i], "bad_words ban every possible next token at this position", fx)
            keep = [i for i in range(len(requests)) if i not in exhausted]
            if not keep:
                return fx
            requests, out = [requests[i] for i in keep], select_result_rows(out, keep)
        for request, token in zip(requests, out.sampled.tolist()):
            request.sampled_token = token
        decisions, failures = route_rows(self.policy, requests, out)
        for request in requests:
            if request.rid in failures:
                self._fail(request, failures[request.rid], fx)
        record_log_probs(requests, decisions, out)
        lengths = [len(r.token_ids) for r in requests]
        for request, decision in zip(requests, decisions):
            if decision is not None:
                self._apply(request, decision, fx)
        committed = [len(r.token_ids) - before for r, before in zip(requests, lengths)]
        fx.append(Routed([d.destination if d else "" for d in decisions], committed,
                         all(len(row.new_tokens) == 1 for row in batch.rows)))
        return fx

    # --- routing, commits, handoffs ---------------------------------------------------------------------
    def _apply(self, request: RequestState, decision: Route, fx: list[Effect]) -> None:
        if decision.state is not None:
            request.state = dict(decision.state)
        token = request.sampled_token if decision.token is None else int(decision.token)
        if token is None:  # on_step sets every routed row's sampled token first: a bug, ended alone
            return self._fail(request, "routed before its step sampled a token", fx)
        request.sampled_token = token
        if decision.destination == self.name:
            self.commit(request, [token], [self.index], fx, [request.sampled_logprob])
        elif decision.destination in self.peers:
            self._hand_off(request, decision.destination, token, fx)
        else:
            self._fail(request, f"policy '{self.policy.name}' routed to unknown model '{decision.destination}'", fx)

    def commit(self, request: RequestState, tokens: list[int], origins: list[int], fx: list[Effect],
               logprobs: list[float | None], *, inform_entry: bool = True) -> bool:
        """This model (the holder) commits tokens. Returns True when that ended the request."""
        request.commit(tokens, origins, logprobs)
        request.sampled_token = request.sampled_logprob = None
        self.stats.tokens_committed += len(tokens)
        reason = request.finish_reason(self.limits.max_model_len)
        self.role.on_commit(request, tokens, origins, reason, inform_entry, fx)
        if reason is not None:
            self.finish(request, reason, fx, notified=True)
            return True
        return False

    def _hand_off(self, request: RequestState, peer: str, sampled: int | None, fx: list[Effect]) -> None:
        """``sampled``: the token this model's last step sampled (None: a handoff sent again, with no step)."""
        try:
            message = self.policy.send(request.view(), peer)
            expected = len(request.token_ids) + (1 if message.keep_sampled else 0)
            if message.keep_sampled and sampled is None:
                raise ValueError("it keeps a sampled token, and none was sampled")
            if message.anchor != request.known.get(peer, 0) or message.end != expected:
                raise ValueError(f"its handoff covers [{message.anchor}, {message.end}) of a context of {expected}")
        except Exception as exc:
            self._fail(request, f"policy '{self.policy.name}' failed to send: {type(exc).__name__}: {exc}", fx)
            return
        # A kept sampled token is committed here (attributed to this model) and may end the request.
        if message.keep_sampled and sampled is not None and self.commit(request, [sampled], [self.index], fx,
                                                                        [request.sampled_logprob], inform_entry=False):
            return
        stamp_handoff(request, message, sender=self.name, peer=peer, active=self.active)
        self.runnable.pop(request.rid, None)
        self.stats.handoffs_out += 1
        fx.append(Send(peer, message))

    def finish(self, request: RequestState, reason: str, fx: list[Effect], *, notified: bool = False) -> None:
        """The request completed normally (``reason``: a stop rule's finish reason)."""
        self.role.end(request, reason, None, notified, fx)

    def _fail(self, request: RequestState, error: str, fx: list[Effect]) -> None:
        """An error ended the request (finish reason "error")."""
        self.role.end(request, "error", error, False, fx)

    def release(self, rid: str, fx: list[Effect]) -> None:
        """Forget the request here and free its KV; late messages for it are ignored."""
        self.requests.pop(rid, None)
        self.runnable.pop(rid, None)
        self.tombstones[rid] = self.now
        fx.append(Release(rid))

    def make_runnable(self, request: RequestState) -> None:
        self.requests[request.rid] = request
        self.runnable[request.rid] = None

    # --- peer messages --------------------------------------------------------------------------------
    def _on_message(self, message: PeerMessage, fx: list[Effect]) -> None:
        if message.sender not in self.peers:
            return self.drop_message(message, "unknown sender")
        if message.active is not None:
            self.role.on_active(message.active)
        if message.kind == "active":
            return None
        if message.rid in self.tombstones:
            return None  # a late message for a request that is already over
        if message.kind == "release":
            return self.role.on_release(message, fx)
        if message.kind in ("progress", "ended"):
            return self.role.on_suffix(message, fx)
        if message.kind == "handoff":
            return self._on_handoff(message, fx)
        return self.drop_message(message, f"unknown kind {message.kind!r}")

    def _on_handoff(self, message: PeerMessage, fx: list[Effect]) -> None:
        request = self.requests.get(message.rid)
        problem = handoff_problem(request, message, first_visit_allowed=self.role.takes_first_visits)
        if problem is not None:
            self.drop_message(message, problem)
            if request is not None and not request.here:  # held by no one now: end it, or it hangs
                self._fail(request, f"a handoff from '{message.sender}' did not fit: {problem}", fx)
            return None
        if request is None:
            spec = message.request
            if spec is None:  # handoff_problem refuses a handoff for an unknown request without its spec
                raise ValueError("a first visit without the request's spec")
            request = RequestState(rid=message.rid, model=self.name, model_index=self.index, token_ids=[],
                                   prompt_len=spec.prompt_len, origins=[], spec=spec)
            self.requests[request.rid] = request
        self.stats.handoffs_in += 1
        try:
            tokens = list(self.policy.receive(request.view(), message))
        except Exception as exc:
            return self._fail(request, f"policy '{self.policy.name}' failed to receive: {exc}", fx)
        grown = accept_handoff(request, message, tokens, self.now)
        self.runnable[request.rid] = None
        self.role.on_grown(request, grown, None, None, fx)
        return None

    def drop_message(self, message: PeerMessage, reason: str) -> None:
        self.stats.dropped_messages[reason] += 1
        log.warning("%s: dropped %s for %s from %s: %s", self.name, message.kind, message.rid, message.sender, reason)

    def _prune_tombstones(self) -> None:
        horizon = self.now - TOMBSTONE_TTL_S
        if not self.tombstones or next(iter(self.tombstones.values())) >= horizon:
            return  # insertion order = age order: nothing old enough yet
        for rid in [rid for rid, at in self.tombstones.items() if at < horizon]:
            del self.tombstones[rid]

