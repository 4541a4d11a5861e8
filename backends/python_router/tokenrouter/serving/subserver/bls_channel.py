"""A peer link's channel to a subserver of the same Triton server (peer_link.py): each call is one
BLS request (``peer_message``, the link's parameters) into the peer model, made on this channel's
own thread with a blocking ``exec``: never from an event loop, never concurrent
``async_exec(decoupled=True)`` (see notes/triton.md). So the channel carries one call at a time,
and ``SAME_SERVER`` tells the session to keep one batch in flight: what is queued meanwhile goes
together in the next call (a burst of handoffs costs one round trip).

A call the peer answered (its FINAL, or its error) is reported with its number; a call that raised
(the peer model unloaded, the server stopping) breaks the channel, and the session opens another.

No call goes out before every model of the server's repository is loaded (``ServerLoaded``): until
then Triton refuses any inference, BLS included ("Server not ready"), and Triton 2.51's Python backend
crashed tritonserver (SIGSEGV in libtriton_python.so) on such refused calls, twice in a row, while the
real pair took a minute to load and the session asked ten times a second.
"""

from __future__ import annotations

import logging
import queue
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

from ..schema import PEER_INPUT, SUBSERVER_INPUTS
from .sending_session import Pacing

log = logging.getLogger(__name__)

# One call at a time; a peer that is loading is asked again soon (it is in this server: loaded soon,
# or the server does not start); messages wait for it meanwhile.
SAME_SERVER = Pacing(in_flight=1, max_retry_s=0.1, hold_while_connecting=True)


class ServerLoaded:
    """Whether every model of this server is loaded (``pb_utils.is_model_ready``: a question, not an
    inference); once it was, it stays so (an unloading peer makes calls raise, as it did before)."""

    def __init__(self, pb_utils: Any, models: Sequence[str]) -> None:
        self._pb, self._waiting = pb_utils, list(models)

    @classmethod
    def of_repository(cls, pb_utils: Any, repository: Path) -> ServerLoaded:
        return cls(pb_utils, sorted(path.parent.name for path in repository.glob("*/config.pbtxt")))

    def __call__(self) -> bool:
        self._waiting = [model for model in self._waiting if not self._pb.is_model_ready(model)]
        return not self._waiting


class BlsChannel:
    def __init__(self, pb_utils: Any, model: str, on_answer: Callable[[int | None, str | None], None],
                 on_broken: Callable[[str], None], *, server_loaded: Callable[[], bool]) -> None:
        self._pb, self._model, self._server_loaded = pb_utils, model, server_loaded
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
            if not self._server_loaded():  # the session asks again soon (SAME_SERVER's pacing)
                self._on_broken("the server is not ready: its models are still loading")
                return
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

