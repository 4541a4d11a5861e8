"""A subserver's output as Triton decoupled responses, sent from one thread of their own.

The decoding loop only queues events; the writer thread sends them in order and polls every
tracked sender for client cancellation, so the loop never waits on Triton's IPC.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

PREFIX_WINDOW = 8  # tokens before a chunk that postprocessing needs to decode it UTF-8-safely
CANCEL_POLL_S = 0.02


class TritonSink:
    """A request's output as decoupled responses: one per event when streaming, else one at the end."""

    def __init__(self, writer: "ResponseWriter", rid: str, sender: Any, stream: bool, names: list[str],
                 entry_index: int) -> None:
        self._writer, self._rid, self._sender, self._stream = writer, rid, sender, stream
        self._names, self._entry_index = names, entry_index
        self._emitted: list[int] = []
        self._pending_tokens: list[int] = []
        self._pending_origins: list[int] = []
        self._large = 0

    def on_output(self, tokens: list[int], origins: list[int], finish_reason: str | None = None,
                  error: str | None = None, logprobs: list[float] | None = None) -> None:
        self._pending_tokens += tokens
        self._pending_origins += origins
        self._large += sum(1 for o in origins if o != self._entry_index)
        if finish_reason is None and not self._stream:
            return
        if finish_reason == "error":
            self._writer.error(self._rid, self._sender, error or "generation failed")
            return
        total = len(self._emitted) + len(self._pending_tokens)
        self._writer.respond(self._rid, self._sender, {
            "output_ids": np.array(self._pending_tokens, dtype=np.int32),
            "prefix_ids": np.array(self._emitted[-PREFIX_WINDOW:], dtype=np.int32),
            "output_models": np.array([self._names[o].encode() for o in self._pending_origins], dtype=np.object_),
            "finish_reason": np.array([(finish_reason or "").encode()], dtype=np.object_),
            "large_model_share": np.array([self._large / total if total else 0.0], dtype=np.float32),
            "is_final": np.array([finish_reason is not None], dtype=bool),
        }, final=finish_reason is not None)
        self._emitted += self._pending_tokens
        self._pending_tokens, self._pending_origins = [], []


class ResponseWriter:
    """Sends responses from one thread, in order, and polls client cancellation."""

    def __init__(self, pb_utils: Any, subserver: Any, batch_dim: bool) -> None:
        self._pb, self._subserver, self._batch_dim = pb_utils, subserver, batch_dim
        self._queue: queue.Queue = queue.Queue()
        self._senders: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="responses", daemon=True)
        self._thread.start()

    def track(self, rid: str, sender: Any) -> None:
        with self._lock:
            self._senders[rid] = sender

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

    def respond(self, rid: str, sender: Any, outputs: dict[str, np.ndarray], final: bool) -> None:
        self._queue.put(("data", rid, sender, outputs, final))

    def error(self, rid: str, sender: Any, message: str) -> None:
        self._queue.put(("error", rid, sender, message, True))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        last_poll = time.monotonic()
        while True:
            try:
                item = self._queue.get(timeout=CANCEL_POLL_S)
            except queue.Empty:
                item = False
            if item is None:
                return
            if item:
                self._send(*item)
            if time.monotonic() - last_poll >= CANCEL_POLL_S:  # also under load, when the queue is never empty
                self._poll_cancellation()
                last_poll = time.monotonic()

    def _send(self, kind: str, rid: str, sender: Any, body: Any, final: bool) -> None:
        pb = self._pb
        if final:
            self.untrack(rid)
        try:
            if kind == "error":
                response = pb.InferenceResponse(output_tensors=[], error=pb.TritonError(body))
            else:
                response = pb.InferenceResponse([pb.Tensor(name, array[None] if self._batch_dim else array)
                                                 for name, array in body.items()])
            sender.send(response, flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)
        except Exception as exc:  # the client is gone; the runtime learns it from is_cancelled
            log.debug("response could not be sent", exc_info=True)
            if final:  # Triton frees a request only on a FINAL: never leave one without it
                self._send_final_error(sender, f"the response could not be sent: {type(exc).__name__}: {exc}")

    def _send_final_error(self, sender: Any, message: str) -> None:
        pb = self._pb
        try:
            sender.send(pb.InferenceResponse(output_tensors=[], error=pb.TritonError(message)),
                        flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:
            log.debug("the final error could not be sent either", exc_info=True)

    def _poll_cancellation(self) -> None:
        with self._lock:
            senders = list(self._senders.items())
        for rid, sender in senders:
            if sender.is_cancelled():
                self.untrack(rid)
                self._subserver.cancel(rid)
