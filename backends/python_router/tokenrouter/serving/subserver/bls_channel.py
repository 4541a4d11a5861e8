"""A peer link's channel to a subserver of the same Triton server (peer_link.py): each call is one
BLS request (``peer_message``, the link's parameters) into the peer model, made on this channel's
own thread with a blocking ``exec``: never from an event loop, never concurrent
``async_exec(decoupled=True)`` (see notes/triton.md). So the channel carries one call at a time,
and ``SAME_SERVER`` tells the session to keep one batch in flight: what is queued meanwhile goes
together in the next call (a burst of handoffs costs one round trip).

A call the peer answered (its FINAL, or its error) is reported with its number; a call that raised
(the peer model unloaded, the server stopping) breaks the channel, and the session opens another.

No channel opens before Triton serves (``ServerServing``; the session tries again soon, as with any
stream that cannot open, and messages wait): until the whole server is ready Triton refuses
any call a stub makes into it ("Server not ready"), BLS and readiness questions alike, and Triton 2.51's
Python backend crashed tritonserver on such refused calls while the real pair loaded for a minute and
the session asked ten times a second (a SIGSEGV in libtriton_python.so after refused BLS calls, twice
in a row; an abort on a boost lock_exception after refused ``is_model_ready`` calls).
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable

from ..schema import PEER_INPUT, SUBSERVER_INPUTS
from .sending_session import Pacing

log = logging.getLogger(__name__)

# One call at a time; a broken channel is reopened soon (the peer is in this server); messages wait
# for it meanwhile.
SAME_SERVER = Pacing(in_flight=1, max_retry_s=0.1, hold_while_connecting=True)


class ServerServing:
    """Whether Triton serves yet, learnt without asking it: Triton hands a model its first request (a
    client's, a peer's hello, a control call) only once the whole server is ready. The entry's links
    therefore open with its first request, and a peer's with the entry's hello."""

    def __init__(self) -> None:
        self._serving = threading.Event()

    def saw_a_request(self) -> None:
        self._serving.set()

    def __call__(self) -> bool:
        return self._serving.is_set()


class ServerNotServing(RuntimeError):
    """A channel asked for before this server serves (the session tries again soon)."""


class BlsChannel:
    def __init__(self, pb_utils: Any, model: str, on_answer: Callable[[int | None, str | None], None],
                 on_broken: Callable[[str], None], *, server_serving: Callable[[], bool]) -> None:
        if not server_serving():
            raise ServerNotServing("this server has not served a request yet: no call into it before all its "
                                   "models are loaded")
        self._pb, self._model = pb_utils, model
        self._on_answer, self._on_broken = on_answer, on_broken
        self._calls: queue.Queue[tuple[int, bytes, dict[str, str]] | None] = queue.Queue()  # None: closed
        self._closed = False
        threading.Thread(target=self._run, name=f"bls-to-{model}", daemon=True).start()

    def send(self, number: int, payload: bytes, parameters: dict[str, str]) -> None:
        self._calls.put((number, payload, parameters))

    def close(self) -> None:
        """Calls not made yet are dropped; one in progress ends on its own, unreported."""
        self._closed = True
        self._calls.put(None)

    def _run(self) -> None:
        while (call := self._calls.get()) is not None and not self._closed:
            number, payload, parameters = call
            request = self._pb.InferenceRequest(
                model_name=self._model, requested_output_names=[], parameters=parameters,
                inputs=[self._pb.Tensor(PEER_INPUT, SUBSERVER_INPUTS[PEER_INPUT].row(payload))])  # one batch row
            error = None
            try:
                for response in request.exec(decoupled=True):
                    if response.has_error():
                        error = response.error().message()
            except Exception as exc:  # noqa: BLE001 - the peer model is unloaded, crashed, or the server is stopping
                if not self._closed:
                    self._on_broken(f"{type(exc).__name__}: {exc}")
                return
            if not self._closed:
                self._on_answer(number, error)

