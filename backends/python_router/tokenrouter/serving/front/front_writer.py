"""Every use of a front's response senders, on one thread: responses, errors, cancellation polls.

Seen on the bundled Triton 2.51: a Python stub whose threads send responses concurrently (even
each on its own sender) corrupts its heap within minutes under 50 streams ("malloc(): unaligned
fastbin chunk detected"), while the same load with every send on one thread ran clean (8 rounds of
100 streams). So the generation threads only queue their outputs here, like the entry's
SubserverWriter (subserver/subserver_writer.py). Polling a sender after its FINAL crashes
tritonserver (SIGSEGV, see intake.py): a request leaves the poll before its FINAL goes out, on this
same thread.

The writer also watches for clients that cancelled or went away: Triton does not pass a client's
cancellation on to a BLS request, so it cancels the entry's requests by the keys the front gave
them (an authenticated control call). Each is_cancelled() is an IPC round trip: every live request
is polled once per CANCEL_POLL_S, or more seldom once many are live (``cancel_poll_interval``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Collection, Mapping

import numpy as np

from ..cancel_polling import CANCEL_POLL_S, cancel_poll_interval
from ..error_codes import code_name, coded_message
from ..triton_api import InferenceResponse, PbUtils, ResponseSender

log = logging.getLogger(__name__)


@dataclass(eq=False)
class ClientRequest:
    """One client request at a front; its state is the writer thread's alone."""

    sender: ResponseSender
    keys: list[str]  # one per generation: the names the entry knows them by
    wanted: frozenset[str] | None  # the outputs the client asked for (None: all)
    code_in_message: bool = False  # errors read "CODE: message" (error_codes.ERROR_CODES_PARAMETER)
    request_id: str = ""  # the client's request id (what TensorRT-LLM's stop request names)
    running: int = field(init=False)  # generations not ended yet
    done: bool = False

    def __post_init__(self) -> None:
        self.running = len(self.keys)


@dataclass
class _ClientOutput:
    request: ClientRequest
    outputs: Mapping[str, np.ndarray]
    last_of_generation: bool


@dataclass
class _ClientError:
    request: ClientRequest
    message: str
    code: int


@dataclass
class _Stop:
    request_id: str
    caller: ResponseSender  # the stop request's sender, answered once the named requests are cancelled


@dataclass
class _EndAll:
    message: str
    code: int
    caller: ResponseSender  # the control call's sender, answered once the others are


@dataclass
class _Drained:
    caller: ResponseSender  # the launcher's drain call: answered with whether requests are still live


class FrontWriter:
    def __init__(self, pb_utils: PbUtils, cancel_at_entry: Callable[[list[str]], None], *,
                 cancel_poll_s: float = CANCEL_POLL_S) -> None:
        """``cancel_at_entry(keys)``: end the entry's requests named ``keys`` (a control call)."""
        self._pb, self._cancel_at_entry, self._cancel_poll_s = pb_utils, cancel_at_entry, cancel_poll_s
        self._queue: queue.Queue = queue.Queue()
        self._live: set[ClientRequest] = set()
        self._thread = threading.Thread(target=self._loop, name="front-responses", daemon=True)
        self._thread.start()

    def open(self, sender: ResponseSender, keys: list[str], wanted: Collection[str] | None,
             code_in_message: bool = False, request_id: str = "") -> ClientRequest:
        """A request whose generations are about to start (queued before any of their output)."""
        request = ClientRequest(sender, keys, None if wanted is None else frozenset(wanted), code_in_message,
                                request_id)
        self._queue.put(request)
        return request

    def respond(self, request: ClientRequest, outputs: Mapping[str, np.ndarray], last_of_generation: bool) -> None:
        """A response of one generation; the FINAL flag rides on the last response of the last one."""
        self._queue.put(_ClientOutput(request, outputs, last_of_generation))

    def fail(self, request: ClientRequest, message: str, code: int) -> None:
        """End the request with an error; its other generations are cancelled at the entry."""
        self._queue.put(_ClientError(request, message, code))

    def reject(self, sender: ResponseSender, message: str, code: int, code_in_message: bool = False) -> None:
        """Answer a request that never started with an error."""
        self._queue.put(_ClientError(ClientRequest(sender, [], None, code_in_message), message, code))

    def stop(self, request_id: str, caller: ResponseSender) -> None:
        """Cancel the live requests whose client named them ``request_id`` (TensorRT-LLM's stop request:
        they end as 'cancelled', answered as usual); then answer ``caller`` with an empty final response."""
        self._queue.put(_Stop(request_id, caller))

    def end_all(self, message: str, code: int, caller: ResponseSender) -> None:
        """End every live request with an error saying ``message`` (the launcher's control call: the
        server is about to restart, and the entry may be the model that died); then answer ``caller``."""
        self._queue.put(_EndAll(message, code, caller))

    def answer_drained(self, caller: ResponseSender) -> None:
        """Answer the launcher's drain call: success when no request is live any more, else an
        UNAVAILABLE error that says how many are (the launcher asks again until its deadline)."""
        self._queue.put(_Drained(caller))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        last_poll = time.monotonic()
        while True:
            try:
                items = [self._queue.get(timeout=self._cancel_poll_s)]
            except queue.Empty:
                items = []
            while True:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            for item in items:
                if item is None:
                    return
                self._take(item)
            if time.monotonic() - last_poll >= cancel_poll_interval(len(self._live), self._cancel_poll_s):
                # also when the queue is never empty
                self._poll_cancellation()
                last_poll = time.monotonic()

    def _take(self, item: ClientRequest | _ClientOutput | _ClientError | _Stop | _EndAll | _Drained) -> None:
        if isinstance(item, ClientRequest):
            self._live.add(item)
        elif isinstance(item, _Stop):
            keys = [key for request in self._live if request.request_id == item.request_id for key in request.keys]
            if keys:
                self._cancel(keys)
            self._send(item.caller, self._pb.InferenceResponse(output_tensors=[]), final=True)
        elif isinstance(item, _ClientOutput):
            self._send_output(item)
        elif isinstance(item, _EndAll):
            for request in list(self._live):
                self._fail(request, item.message, item.code)
            self._send(item.caller, self._pb.InferenceResponse(output_tensors=[]), final=True)
        elif isinstance(item, _Drained):
            error = self._pb.TritonError(f"{len(self._live)} request(s) in flight",
                                         self._pb.TritonError.UNAVAILABLE) if self._live else None
            self._send(item.caller, self._pb.InferenceResponse(output_tensors=[], error=error), final=True)
        elif not item.request.done:
            self._fail(item.request, item.message, item.code)
            if len(item.request.keys) > 1:
                self._cancel(item.request.keys)

    def _fail(self, request: ClientRequest, message: str, code: int) -> None:
        self._end(request)
        if request.code_in_message:
            message = coded_message(code_name(self._pb, code), message)
        error = self._pb.TritonError(message, code)
        self._send(request.sender, self._pb.InferenceResponse(output_tensors=[], error=error), final=True)

    def _send_output(self, item: _ClientOutput) -> None:
        request, pb = item.request, self._pb
        if request.done:
            return  # the request failed or was cancelled: a late generation's output goes nowhere
        request.running -= item.last_of_generation
        final = request.running == 0
        if final:
            self._end(request)
        response = pb.InferenceResponse([pb.Tensor(name, array) for name, array in item.outputs.items()
                                         if request.wanted is None or name in request.wanted])
        self._send(request.sender, response, final)

    def _end(self, request: ClientRequest) -> None:
        request.done = True
        self._live.discard(request)

    def _send(self, sender: ResponseSender, response: InferenceResponse, final: bool) -> None:
        pb = self._pb
        try:
            sender.send(response, flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)
        except Exception as exc:  # the client is gone; Triton frees a request only on a FINAL
            log.debug("a response could not be sent", exc_info=True)
            if final:
                try:
                    sender.send(pb.InferenceResponse(output_tensors=[], error=pb.TritonError(
                        f"the response could not be sent: {type(exc).__name__}: {exc}")),
                        flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                except Exception:
                    log.debug("the final error could not be sent either", exc_info=True)

    def _poll_cancellation(self) -> None:
        gone = [request for request in self._live if self._cancelled(request)]
        for request in gone:
            self._live.discard(request)  # its generations end as 'cancelled' and are sent as usual
        if gone:
            self._cancel([key for request in gone for key in request.keys])

    @staticmethod
    def _cancelled(request: ClientRequest) -> bool:
        try:
            return bool(request.sender.is_cancelled())
        except Exception:  # a poll that fails says nothing; the request ends on its own
            log.debug("polling a request for cancellation failed", exc_info=True)
            return False

    def _cancel(self, keys: list[str]) -> None:
        try:
            self._cancel_at_entry(keys)
        except Exception:  # the entry is gone: its requests end with the server
            log.exception("could not cancel %d request(s) at the entry", len(keys))
