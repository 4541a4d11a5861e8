"""The loop around one subserver core: its thread, its inbox, the strategy hooks, the effects.

Everything that changes a request's state runs on this loop's thread, inside the core; other
threads (clients, peers, Triton) only put events into the inbox. That keeps the hot path
lock-free and makes "no subserver ever waits for another's step" hold by construction. The loop
decides nothing: it asks the core, runs the engine step the core picked, and performs the effects
the core returns (send, emit, release) in order.

A loop that dies anyway (a bug) is observable (``alive``, ``failure``, the ``died`` event) and fails
every request it held or had queued with the error, so no client waits forever.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable, Sequence

from ..engine.base import Engine, EngineLost
from ..protocol import PeerMessage, RequestSpec
from .core import SubserverCore
from .effects import Batch, Effect, Emit, Release, Routed, Send
from .inbox import Cancelled, Delivered, Event, Failed, PeerForgot, PeerLost, Submitted, Wake
from .observers import StepLog, StepObserver, StepRecord
from .request import ClientSink, Submission
from .strategies import Strategy
from .transport import PeerUnreachable, Transport

log = logging.getLogger(__name__)

IDLE_POLL_S = 0.1  # how long an idle loop sleeps between looks at the inbox


class Subserver:
    def __init__(self, core: SubserverCore, engine: Engine, transport: Transport, strategy: Strategy,
                 observers: Sequence[StepObserver] = ()) -> None:
        self.core = core
        self.engine = engine
        self.transport = transport
        self.strategy = strategy
        self.observers = list(observers)
        self.failure: str | None = None  # why the loop died, if it did
        self.died = threading.Event()  # set once a dead loop has failed its requests
        self._inbox: queue.Queue[Event] = queue.Queue()
        self._queue_lock = threading.Lock()  # guards the admission bound (see ``submit``)
        self._submits_in_inbox = 0
        self._stopped = False
        self._thread: threading.Thread | None = None
        strategy.register(self.has_work)

    # --- what the serving layer and tests read ------------------------------------------------------
    name = property(lambda self: self.core.name)
    index = property(lambda self: self.core.index)
    models = property(lambda self: self.core.models)
    entry = property(lambda self: self.core.entry)
    is_entry = property(lambda self: self.core.name == self.core.entry)
    stats = property(lambda self: self.core.stats)
    requests = property(lambda self: self.core.requests)
    runnable = property(lambda self: self.core.runnable)
    active = property(lambda self: self.core.active)
    queued = property(lambda self: self.core.queued + self._submits_in_inbox)  # waiting for admission

    @property
    def alive(self) -> bool:
        """The loop thread runs (False before ``start``, after ``stop`` and after a crash)."""
        return self._thread is not None and self._thread.is_alive() and self.failure is None

    @property
    def step_log(self) -> StepLog | None:
        return next((o for o in self.observers if isinstance(o, StepLog)), None)

    # --- thread-safe entry points -------------------------------------------------------------------
    def start(self, on_death: Callable[[], None] = lambda: None) -> None:
        """``on_death()`` runs on the loop's thread if the loop dies, once it failed its requests (the
        Triton glue takes its stub down there, with no thread of its own waiting for it)."""
        self._thread = threading.Thread(target=self._run, args=(on_death,), name=f"subserver-{self.name}",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopped = True
        self.strategy.stop()
        self._inbox.put(Wake())
        if self._thread is not None:
            self._thread.join(timeout)
        for observer in self.observers:
            observer.close()

    def deliver(self, message: PeerMessage) -> None:
        if message.kind == "estimates":  # about the model, not a request: no need for the loop
            for observer in self.observers:
                observer.on_estimates(message)
            return
        self._put(Delivered(message))

    def submit(self, rid: str, prompt_ids: list[int], spec: RequestSpec, sink: ClientSink) -> None:
        """Queue a client request (entry only). Raises at once RequestError for bad input and
        ServerBusy when the admission queue is full."""
        if self.failure is not None:
            raise RuntimeError(f"subserver '{self.name}' is down: {self.failure}")
        self.core.validate(prompt_ids, spec, self.engine.vocab_size)
        # The bound counts what is queued in the core plus what is still in the inbox; the loop
        # moves a submission from one to the other under the same lock, so it holds exactly.
        with self._queue_lock:
            self.core.check_room(self._submits_in_inbox)
            self._submits_in_inbox += 1
        self._put(Submitted(Submission(rid, list(prompt_ids), spec, sink, submitted_at=time.monotonic())))

    def cancel(self, rid: str) -> None:
        self._put(Cancelled(rid))

    def peer_lost(self, peer: str, error: str) -> None:
        """``peer`` is unreachable: the requests that cannot go on without it end with ``error``."""
        self._put(PeerLost(peer, error))

    def peer_forgot(self, peer: str, rid: str) -> None:
        """``peer`` holds nothing of ``rid`` any more (its instance there is gone; another one takes it):
        the request goes on there from its whole context (``SubserverCore.peer_forgot``)."""
        self._put(PeerForgot(peer, rid))

    def fail(self, rid: str, error: str) -> None:
        """End a request with an error from outside the loop (e.g. its handoff could not be sent)."""
        self._put(Failed(rid, error))

    def has_work(self) -> bool:
        return self.core.has_work() or not self._inbox.empty()

    def _put(self, event: Event) -> None:
        self._inbox.put(event)
        self.strategy.notify_work()
        if self.failure is not None:  # the loop died after the caller looked: answer it here
            self._fail_queued()

    # --- the decoding loop --------------------------------------------------------------------------
    def _run(self, on_death: Callable[[], None]) -> None:
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001  (a bug: make it visible and fail the requests)
            log.exception("the loop of subserver %s died", self.name)
            self.failure = f"{type(exc).__name__}: {exc}"
            self._fail_everything(f"subserver '{self.name}' failed: {self.failure}")
            self.died.set()
            on_death()
            return
        self._apply(self.core.shutdown("the server is shutting down"))

    def _loop(self) -> None:
        while not self._stopped:
            self.strategy.start_round()
            if self._stopped:
                break
            self._drain(timeout=0.0)
            self._apply(self.core.tick(time.monotonic()))
            batch = self.core.schedule(time.monotonic())
            if batch is not None:
                self.strategy.run_step(lambda: self._execute(batch))
            elif not self.strategy.lockstep:
                wait = self.core.wait_left(time.monotonic())
                self._drain(timeout=IDLE_POLL_S if wait is None else wait)

    def _drain(self, timeout: float) -> None:
        try:
            event = self._inbox.get(timeout=timeout) if timeout > 0 else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(event)
            try:
                event = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, event: Event) -> None:
        now = time.monotonic()
        match event:
            case Delivered(message):
                self._apply(self.core.on_message(message, now))
            case Submitted(submission):
                with self._queue_lock:
                    self._submits_in_inbox -= 1
                    effects = self.core.submit(submission, now)
                self._apply(effects)
            case Cancelled(rid):
                self._apply(self.core.cancel(rid, now))
            case Failed(rid, error):
                self._apply(self.core.fail(rid, error, now))
            case PeerLost(peer, error):
                self._apply(self.core.peer_lost(peer, error, now))
            case PeerForgot(peer, rid):
                self._apply(self.core.peer_forgot(rid, peer, now))
            case Wake():
                pass

    def _execute(self, batch: Batch) -> None:
        for row in batch.rows:
            if not self.engine.has_sequence(row.seq_id):
                self.engine.add_sequence(row.seq_id)  # its first step: a prefill (or its first chunk)
        policy = self.core.policy
        start = time.monotonic()
        try:
            result = self.engine.step(batch.rows, return_hidden=policy.needs_hidden, top_logits=policy.top_logits,
                                      return_logits=batch.needs_logits)
        except Exception as exc:  # one bad step fails its requests, never the subserver
            log.exception("step failed on %s", self.name)
            error = f"{type(exc).__name__} on {self.name}: {exc}"
            self._apply(self.core.on_step_failed(batch, error, time.monotonic()))
            if isinstance(exc, EngineLost):
                raise  # nothing can run on this model again: the loop goes down and fails the rest
            return
        end = time.monotonic()
        self.core.stats.busy_s += end - start
        effects = self.core.on_step(batch, result, end)
        routed = next((e for e in effects if isinstance(e, Routed)), None)
        self._apply(effects)
        if self.observers:
            record = StepRecord(start, end, [(row.seq_id, len(row.new_tokens)) for row in batch.rows])
            for observer in self.observers:
                try:
                    observer.on_step(self, record, routed)
                except Exception:
                    log.exception("step observer %r failed on %s", observer, self.name)

    # --- effects ------------------------------------------------------------------------------------
    def _apply(self, effects: list[Effect]) -> None:
        sends: dict[str, list[PeerMessage]] = {}
        for effect in effects:
            if isinstance(effect, Send):
                sends.setdefault(effect.peer, []).append(effect.message)
            elif isinstance(effect, Emit):
                self._emit(effect)
            elif isinstance(effect, Release):
                self.engine.release(effect.rid)
        for peer, messages in sends.items():  # after the rest: a step's messages to a peer travel together
            self._send(peer, messages)

    def _send(self, peer: str, messages: list[PeerMessage]) -> None:
        try:
            self.transport.send(peer, messages)
        except Exception as exc:
            if isinstance(exc, PeerUnreachable):  # expected while a peer server is down: no traceback
                log.warning("%s: %d message(s) to %s not sent: %s", self.name, len(messages), peer, exc)
            else:
                log.exception("%s: sending %d message(s) to %s failed", self.name, len(messages), peer)
            for message in messages:
                if message.kind == "handoff":  # the request would be held by no one: end it
                    self._apply(self.core.fail(message.rid, f"could not reach '{peer}': {exc}", time.monotonic()))

    def _emit(self, effect: Emit) -> None:
        """A failing sink (a client gone away) cancels that request only."""
        try:
            effect.sink.on_output(effect.tokens, effect.origins, effect.finish_reason, effect.error,
                                  logprobs=effect.logprobs)
        except Exception:
            log.exception("%s: the client sink of %s failed; cancelling it", self.name, effect.rid)
            if effect.finish_reason is None:
                self._inbox.put(Cancelled(effect.rid))

    def _fail_everything(self, error: str) -> None:
        try:
            effects = self.core.shutdown(error)
        except Exception:
            log.exception("%s: shutting the core down failed", self.name)
            effects = []
        for effect in effects:  # each on its own: one more failure must not spare the others
            try:
                self._apply([effect])
            except Exception:
                log.exception("%s: failing %s", self.name, effect)
        self._fail_queued()

    def _fail_queued(self) -> None:
        """Answer every submission still in the inbox with the loop's failure."""
        while True:
            try:
                event = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(event, Submitted):
                try:
                    event.submission.sink.on_output([], [], "error", f"subserver '{self.name}' failed: {self.failure}")
                except Exception:
                    log.exception("%s: the client sink of %s failed", self.name, event.submission.rid)
