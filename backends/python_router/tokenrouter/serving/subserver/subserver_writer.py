"""A subserver's output as Triton decoupled responses, sent from one thread of their own.

The decoding loop only queues chunks; the writer thread sends them in order and polls every
tracked sender for client cancellation, so the loop never waits on Triton's IPC.

Every response costs the same however many tokens it carries (a send over the stub's IPC, the
front's detokenizing and its own response, a gRPC message, a client callback), and a hop behind the
writer can fall behind without the writer noticing (the front's stub queues for it). So the writer
paces each stream instead: a request's responses are at least (live streams / max_responses_per_s)
apart, and tokens produced in between leave together in the next one, each with its model and in
its place (``Pacer``). The first token and the final response are never held, so first-token
latency stays; with few streams the interval is below a step and every token still leaves alone.
Like vLLM's and TensorRT-LLM's ``stream_interval``, but in time and only as many streams need.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Collection, Union

from collections import Counter

import numpy as np

from ...config import SchedulingSpec
from ...runtime.emission import large_model_share
from ..cancel_polling import CANCEL_POLL_S, cancel_poll_interval
from ..error_codes import code_name
from ..schema import PREFIX_TOKENS, SUBSERVER_OUTPUTS

log = logging.getLogger(__name__)

MAX_RESPONSES_PER_S: float = SchedulingSpec.model_fields["max_responses_per_s"].default  # one default, in config.py


@dataclass
class Chunk:
    """One response's worth of a request's output, as the decoding loop produced it."""

    tokens: list[int]
    origins: list[bytes]  # the model name of every token, encoded
    prefix: list[int]  # up to PREFIX_TOKENS tokens sent before this chunk (UTF-8 safe decoding)
    finish_reason: str | None
    large_share: float  # of all output so far, this chunk's tokens included
    logprobs: list[float]  # one per token when the request returns log probabilities, else empty

    @property
    def final(self) -> bool:
        return self.finish_reason is not None

    def absorb(self, later: "Chunk") -> None:
        """Append the chunk that followed this one: the prefix before this one precedes both."""
        self.tokens += later.tokens
        self.origins += later.origins
        self.logprobs += later.logprobs
        self.finish_reason, self.large_share = later.finish_reason, later.large_share

    def tensors(self, wanted: Collection[str] | None = None) -> dict[str, np.ndarray]:
        """The subserver's outputs (schema.SUBSERVER_OUTPUTS, but the error ones), each one batch
        row; only those in ``wanted`` (None: all). A tensor costs in every process it crosses."""
        values = {"output_ids": self.tokens, "prefix_ids": self.prefix, "output_models": self.origins,
                  "output_log_probs": self.logprobs, "finish_reason": (self.finish_reason or "").encode(),
                  "large_model_share": self.large_share, "is_final": self.final}
        return {name: SUBSERVER_OUTPUTS[name].row(value) for name, value in values.items()
                if wanted is None or name in wanted}


def in_band_error(message: str, code_name: str) -> dict[str, np.ndarray]:
    """A front's failed request's last response, as data (error_codes.py says why)."""
    return {**Chunk([], [], [], "error", 0.0, []).tensors(), "error": SUBSERVER_OUTPUTS["error"].row(message.encode()),
            "error_code": SUBSERVER_OUTPUTS["error_code"].row(code_name.encode())}


@dataclass
class _Data:
    rid: str
    sender: Any
    chunk: Chunk
    wanted: frozenset[str] | None = None  # the outputs the caller asked for (None: all)

    @property
    def final(self) -> bool:
        return self.chunk.final


@dataclass
class _Error:
    rid: str
    sender: Any
    message: str
    code: Any = None  # a TritonError code; None: Triton's default (INTERNAL)
    in_band: bool = False  # a front's request: the error goes as data (error_codes.py)
    final = True


@dataclass
class _Accepted:
    """An empty first response to a front's request, before any of its output (see intake.py)."""

    sender: Any


Item = Union[_Data, _Error]


class Pacer:
    """What the writer holds between rounds: per request, the output not sent yet and when its last
    response went out. A request's first response and its final one go out at once; between them,
    its responses are at least ``interval`` apart, and what it produces meanwhile merges into the
    held chunk (every token in order, with its model). Used by the writer thread only."""

    def __init__(self) -> None:
        self._held: dict[str, _Data] = {}
        self._last: dict[str, float] = {}  # rid -> when its last response went out

    def add(self, item: Item) -> list[Item]:
        """Take one queued item; returns what must go out now, in this order, whatever the pacing:
        an error (after the output held before it), or a final chunk that a later one cannot join."""
        held = self._held.get(item.rid)
        if isinstance(item, _Error):
            self._held.pop(item.rid, None)
            self._last.pop(item.rid, None)
            return [held, item] if held is not None else [item]
        if held is None or held.final:
            self._held[item.rid] = item
            return [held] if held is not None else []
        held.chunk.absorb(item.chunk)
        return []

    def due(self, now: float, interval: float) -> list[_Data]:
        """The held chunks whose time has come: first and final ones always."""
        out = []
        for rid, item in list(self._held.items()):
            last = self._last.get(rid)
            if item.final or last is None or now - last >= interval:
                out.append(item)
                del self._held[rid]
                if item.final:
                    self._last.pop(rid, None)
                else:
                    self._last[rid] = now
        return out

    def next_due(self, now: float, interval: float) -> float | None:
        """Seconds until the earliest held chunk is due; None when nothing is held."""
        waits = [max(0.0, self._last.get(rid, now - interval) + interval - now) for rid in self._held]
        return min(waits) if waits else None


class TritonSink:
    """A request's output as decoupled responses: chunks as they come when streaming, else one at the end."""

    def __init__(self, writer: "ResponseWriter", rid: str, sender: Any, stream: bool, names: list[str],
                 entry_index: int, wanted: Collection[str] | None = None) -> None:
        """``wanted``: the outputs the caller asked for (None: all)."""
        self._writer, self._rid, self._sender, self._stream = writer, rid, sender, stream
        self._wanted = None if wanted is None else frozenset(wanted)
        self._names = [name.encode() for name in names]
        self._entry_index = entry_index
        self._tail: list[int] = []  # the last PREFIX_TOKENS tokens handed to the writer
        self._unsent: Chunk | None = None  # not streaming: everything so far
        self._by_model: Counter = Counter()

    def on_output(self, tokens: list[int], origins: list[int], finish_reason: str | None = None,
                  error: str | None = None, logprobs: list[float] | None = None) -> None:
        if finish_reason == "error":
            self._writer.error(self._rid, self._sender, error or "generation failed")
            return
        self._by_model.update(origins)
        chunk = Chunk(list(tokens), [self._names[o] for o in origins], self._tail, finish_reason,
                      large_model_share(self._by_model, self._entry_index), list(logprobs or ()))
        self._tail = (self._tail + chunk.tokens)[-PREFIX_TOKENS:]
        if not self._stream:
            if self._unsent is None:
                self._unsent = chunk
            else:
                self._unsent.absorb(chunk)
            if finish_reason is None:
                return
            chunk = self._unsent
        self._writer.respond(self._rid, self._sender, chunk, self._wanted)


class ResponseWriter:
    """Sends paced responses from one thread (see the module docstring) and polls client
    cancellation every ``cancel_poll_s`` (more seldom with many streams: ``cancel_poll_interval``)."""

    def __init__(self, pb_utils: Any, subserver: Any, *,
                 max_responses_per_s: float = MAX_RESPONSES_PER_S, cancel_poll_s: float = CANCEL_POLL_S) -> None:
        self._pb, self._subserver = pb_utils, subserver
        self._max_responses_per_s = max_responses_per_s
        self._cancel_poll_s = cancel_poll_s
        self._pacer = Pacer()
        self._queue: queue.Queue = queue.Queue()
        self._senders: dict[str, Any] = {}
        self._keys: dict[str, str] = {}  # request key (chosen by a front, see front_model.py) -> rid
        self._key_of: dict[str, str] = {}  # rid -> its key
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="responses", daemon=True)
        self._thread.start()

    def track(self, rid: str, sender: Any, key: str | None = None) -> None:
        """Answer ``rid`` through ``sender`` until its final response, polling it for cancellation;
        ``key``: the name a front gave the request, by which it cancels it (``rids_of``) instead."""
        with self._lock:
            self._senders[rid] = sender
            if key is not None:
                self._keys[key], self._key_of[rid] = rid, key

    def rids_of(self, keys: list[str]) -> list[str]:
        """The live requests that fronts named ``keys`` (unknown or finished ones are skipped)."""
        with self._lock:
            return [self._keys[key] for key in keys if key in self._keys]

    def end_all(self, message: str) -> list[str]:
        """Answer every request whose final response is still to come with error ``message``;
        returns their ids (the caller makes the subserver drop them). Output the subserver still
        emits for them afterwards finds a closed sender and is dropped."""
        with self._lock:
            live = list(self._senders.items())
        for rid, sender in live:
            self.error(rid, sender, message)
        return [rid for rid, _ in live]

    def untrack(self, rid: str) -> None:
        with self._lock:
            self._senders.pop(rid, None)
            self._keys.pop(self._key_of.pop(rid, ""), None)

    def respond(self, rid: str, sender: Any, chunk: Chunk, wanted: frozenset[str] | None = None) -> None:
        self._queue.put(_Data(rid, sender, chunk, wanted))

    def error(self, rid: str, sender: Any, message: str, code: Any = None, in_band: bool | None = None) -> None:
        """End ``rid`` with an error; ``in_band`` (None: whether a front named the request) sends it
        as data, the way a front can receive it (error_codes.py)."""
        if in_band is None:
            with self._lock:
                in_band = rid in self._key_of
        self._queue.put(_Error(rid, sender, message, code, in_band))

    def accept(self, sender: Any) -> None:
        self._queue.put(_Accepted(sender))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        last_poll = time.monotonic()
        closing = False
        while not closing:
            interval = len(self._senders) / self._max_responses_per_s  # live streams share the budget
            wait = self._pacer.next_due(time.monotonic(), interval)
            try:
                items = [self._queue.get(timeout=self._cancel_poll_s if wait is None else
                                         min(wait, self._cancel_poll_s))]
            except queue.Empty:
                items = []
            while True:  # one round: everything queued by now
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if None in items:  # close: send what came before it, then stop
                items, closing = items[:items.index(None)], True
            for item in items:
                if isinstance(item, _Accepted):
                    self._send_accepted(item.sender)
                    continue
                for now_due in self._pacer.add(item):
                    self._send(now_due)
            for item in self._pacer.due(time.monotonic(), 0.0 if closing else interval):
                self._send(item)
            polled = len(self._senders) - len(self._key_of)  # see _poll_cancellation
            if time.monotonic() - last_poll >= cancel_poll_interval(polled, self._cancel_poll_s):
                self._poll_cancellation()  # also under load, when the queue is never empty
                last_poll = time.monotonic()

    def _send(self, item: Item) -> None:
        pb = self._pb
        sender, final = item.sender, item.final
        with self._lock:
            in_band = item.in_band if isinstance(item, _Error) else item.rid in self._key_of
        if final:
            self.untrack(item.rid)
        try:
            if isinstance(item, _Error):
                response = self._error_response(item.message, item.code, in_band)
            else:
                response = pb.InferenceResponse([pb.Tensor(name, array)
                                                 for name, array in item.chunk.tensors(item.wanted).items()])
            sender.send(response, flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)
        except Exception as exc:  # the client is gone; the runtime learns it from is_cancelled
            log.debug("response could not be sent", exc_info=True)
            if final:  # Triton frees a request only on a FINAL: never leave one without it
                self._send_final_error(sender, f"the response could not be sent: {type(exc).__name__}: {exc}", in_band)

    def _error_response(self, message: str, code: Any, in_band: bool) -> Any:
        pb = self._pb
        if in_band:
            return pb.InferenceResponse([pb.Tensor(name, array) for name, array in
                                         in_band_error(message, code_name(pb, code)).items()])
        error = pb.TritonError(message) if code is None else pb.TritonError(message, code)
        return pb.InferenceResponse(output_tensors=[], error=error)

    def _send_accepted(self, sender: Any) -> None:
        try:
            sender.send(self._pb.InferenceResponse(output_tensors=[]), flags=0)
        except Exception:  # the client is gone; its request still ends with a FINAL later
            log.debug("the accepted response could not be sent", exc_info=True)

    def _send_final_error(self, sender: Any, message: str, in_band: bool) -> None:
        pb = self._pb
        try:
            sender.send(self._error_response(message, None, in_band), flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:
            log.debug("the final error could not be sent either", exc_info=True)

    def _poll_cancellation(self) -> None:
        """Polls the senders of clients that call this model directly: not a front's requests
        (keyed), since Triton never marks a BLS request cancelled; their front polls its client
        and cancels them by key."""
        with self._lock:
            polled = [(rid, sender) for rid, sender in self._senders.items() if rid not in self._key_of]
        for rid, sender in polled:
            if sender.is_cancelled():
                self.untrack(rid)
                self._subserver.cancel(rid)
