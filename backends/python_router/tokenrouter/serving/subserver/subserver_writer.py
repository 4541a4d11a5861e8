"""A subserver's output as Triton decoupled responses, sent from one thread of their own.

The decoding loop only queues chunks (triton_sink.py); the writer thread sends them in order, paced
per stream (pacing.py), and polls every tracked sender for client cancellation, so the loop never
waits on Triton's IPC.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from ...config import SchedulingSpec
from ..cancel_polling import CANCEL_POLL_S, cancel_poll_interval
from ..error_codes import code_name
from ..triton_api import InferenceResponse, PbUtils, ResponseSender
from .output_chunk import OutputChunk, in_band_error
from .pacing import QueuedItem, Pacer, QueuedChunk, QueuedError
from .tracked_requests import TrackedRequests

log = logging.getLogger(__name__)

MAX_RESPONSES_PER_S: float = SchedulingSpec.model_fields["max_responses_per_s"].default  # one default, in config.py


@dataclass
class _Accepted:
    """An empty first response to a front's request, before any of its output (see intake.py)."""

    sender: ResponseSender


class SubserverWriter:
    """Sends paced responses from one thread (pacing.py) and polls client
    cancellation every ``cancel_poll_s`` (more seldom with many streams: ``cancel_poll_interval``)."""

    def __init__(self, pb_utils: PbUtils, subserver: Any, *,
                 max_responses_per_s: float = MAX_RESPONSES_PER_S, cancel_poll_s: float = CANCEL_POLL_S) -> None:
        self._pb, self._subserver = pb_utils, subserver
        self._max_responses_per_s = max_responses_per_s
        self._cancel_poll_s = cancel_poll_s
        self._pacer = Pacer()
        self._queue: queue.Queue = queue.Queue()
        self._tracked = TrackedRequests()
        self._thread = threading.Thread(target=self._loop, name="responses", daemon=True)
        self._thread.start()

    def track(self, rid: str, sender: ResponseSender, key: str | None = None) -> None:
        """Answer ``rid`` through ``sender`` until its final response, polling it for cancellation;
        ``key``: the name a front gave the request, by which it cancels it (``rids_of``) instead."""
        self._tracked.track(rid, sender, key)

    def rids_of(self, keys: list[str]) -> list[str]:
        """The live requests that fronts named ``keys`` (unknown or finished ones are skipped)."""
        return self._tracked.rids_of(keys)

    def end_all(self, message: str) -> list[str]:
        """Answer every request whose final response is still to come with error ``message``;
        returns their ids (the caller makes the subserver drop them). Output the subserver still
        emits for them afterwards finds a closed sender and is dropped."""
        live = self._tracked.live()
        for rid, sender in live:
            self.error(rid, sender, message)
        return [rid for rid, _ in live]

    def untrack(self, rid: str) -> None:
        self._tracked.untrack(rid)

    def respond(self, rid: str, sender: ResponseSender, chunk: OutputChunk, wanted: frozenset[str] | None = None,
                alone: bool = False) -> None:
        """``alone``: a response of its own, at once (not paced, never merged)."""
        self._queue.put(QueuedChunk(rid, sender, chunk, wanted, alone))

    def error(self, rid: str, sender: ResponseSender, message: str, code: int | None = None,
              in_band: bool | None = None) -> None:
        """End ``rid`` with an error; ``in_band`` (None: whether a front named the request) sends it
        as data, the way a front can receive it (error_codes.py)."""
        if in_band is None:
            in_band = self._tracked.is_keyed(rid)
        self._queue.put(QueuedError(rid, sender, message, code, in_band))

    def accept(self, sender: ResponseSender) -> None:
        self._queue.put(_Accepted(sender))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        last_poll = time.monotonic()
        closing = False
        while not closing:
            interval = len(self._tracked) / self._max_responses_per_s  # live streams share the budget
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
            polled = self._tracked.polled_count()  # see _poll_cancellation
            if time.monotonic() - last_poll >= cancel_poll_interval(polled, self._cancel_poll_s):
                self._poll_cancellation()  # also under load, when the queue is never empty
                last_poll = time.monotonic()

    def _send(self, item: QueuedItem) -> None:
        pb = self._pb
        sender, final = item.sender, item.final
        in_band = item.in_band if isinstance(item, QueuedError) else self._tracked.is_keyed(item.rid)
        if final:
            self.untrack(item.rid)
        try:
            if isinstance(item, QueuedError):
                response = self._error_response(item.message, item.code, in_band)
            else:
                response = pb.InferenceResponse([pb.Tensor(name, array)
                                                 for name, array in item.chunk.tensors(item.wanted).items()])
            sender.send(response, flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)
        except Exception as exc:  # the client is gone; the runtime learns it from is_cancelled
            log.debug("response could not be sent", exc_info=True)
            if final:  # Triton frees a request only on a FINAL: never leave one without it
                self._send_final_error(sender, f"the response could not be sent: {type(exc).__name__}: {exc}", in_band)

    def _error_response(self, message: str, code: int | None, in_band: bool) -> InferenceResponse:
        pb = self._pb
        if in_band:
            return pb.InferenceResponse([pb.Tensor(name, array) for name, array in
                                         in_band_error(message, code_name(pb, code)).items()])
        error = pb.TritonError(message) if code is None else pb.TritonError(message, code)
        return pb.InferenceResponse(output_tensors=[], error=error)

    def _send_accepted(self, sender: ResponseSender) -> None:
        try:
            sender.send(self._pb.InferenceResponse(output_tensors=[]), flags=0)
        except Exception:  # the client is gone; its request still ends with a FINAL later
            log.debug("the accepted response could not be sent", exc_info=True)

    def _send_final_error(self, sender: ResponseSender, message: str, in_band: bool) -> None:
        pb = self._pb
        try:
            sender.send(self._error_response(message, None, in_band), flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:
            log.debug("the final error could not be sent either", exc_info=True)

    def _poll_cancellation(self) -> None:
        """Polls the senders of clients that call this model directly: not a front's requests
        (keyed), since Triton never marks a BLS request cancelled; their front polls its client
        and cancels them by key."""
        for rid, sender in self._tracked.polled():
            if sender.is_cancelled():
                self.untrack(rid)
                self._subserver.cancel(rid)
