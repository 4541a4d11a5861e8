"""A front's calls to the entry subserver, by BLS: one generation's stream, and cancelling by key.

Both carry this server start's secret (peer_auth.py). The stream is a blocking decoupled
``exec`` iterated on the generation's own thread: a BLS ResponseIterator is synchronous, and
Triton 2.51's stub has no way to cancel it, hence the control call that names the request.

A finished iterator is kept for a while before this process lets go of it (``_LateRelease``). In
Triton 2.51's stub, the iterator of a finished stream is also held in a map that a thread of its
own empties without holding the GIL; when that was the last reference, the iterator's responses
and their numpy arrays were freed there, racing the interpreter, and the front's heap was corrupted
("double free or corruption") within seconds when 50 streams were cancelled at once.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Iterable, Iterator, Mapping

import numpy as np

from ..control import ControlCall
from ..error_codes import code_of
from ..peer_auth import peer_parameters
from ..schema import CONTROL_INPUT
from ..text.entry_chunk import EntryChunk
from ..triton_api import BlsResponse, PbUtils


class EntryError(Exception):
    """The entry subserver answered a generation with an error (``code``: Triton's error code)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class _LateRelease:
    """Finished response iterators, each released HOLD_S after its stream ended, by whichever
    stream ends next (a Python thread: see the module docstring)."""

    HOLD_S = 5.0

    def __init__(self) -> None:
        self._held: deque[tuple[float, Iterable[BlsResponse]]] = deque()
        self._lock = threading.Lock()

    def keep(self, iterator: Iterable[BlsResponse]) -> None:
        now = time.monotonic()
        with self._lock:
            self._held.append((now + self.HOLD_S, iterator))
            due = []
            while self._held and self._held[0][0] <= now:
                due.append(self._held.popleft())
        del due  # the last references, dropped here, outside the lock


_late_release = _LateRelease()


def stream_from_entry(pb_utils: PbUtils, entry: str, inputs: Mapping[str, np.ndarray], outputs: list[str],
                      parameters: Mapping[str, str]) -> Iterator[EntryChunk]:
    """The entry's chunks for one generation (its ``outputs``, of schema.SUBSERVER_OUTPUTS), the
    last one final; raises EntryError, also for an error the entry sent as data (error_codes.py)."""
    request = pb_utils.InferenceRequest(model_name=entry, inputs=[pb_utils.Tensor(n, a) for n, a in inputs.items()],
                                        requested_output_names=outputs, parameters=dict(parameters))
    responses = request.exec(decoupled=True)
    try:
        yield from _chunks(pb_utils, responses)
    finally:
        _late_release.keep(responses)


def _chunks(pb_utils: PbUtils, responses: Iterable[BlsResponse]) -> Iterator[EntryChunk]:
    for response in responses:
        if response.has_error():  # only as the first response: Triton loses later ones (error_codes.py)
            raise EntryError(response.error().message(), pb_utils.TritonError.INTERNAL)
        outputs = {tensor.name(): tensor.as_numpy() for tensor in response.output_tensors()}
        if not outputs:  # the entry's first, empty response, or an empty FINAL
            continue
        chunk = EntryChunk.of(outputs)
        if chunk.finish_reason == "error":
            raise EntryError(chunk.error, code_of(pb_utils, chunk.error_code))
        yield chunk


def cancel_at_entry(pb_utils: PbUtils, entry: str, secret: str, keys: list[str]) -> None:
    """End the entry's requests that a front named ``keys`` (each then answers 'cancelled')."""
    call = ControlCall("cancel", keys=tuple(keys))
    request = pb_utils.InferenceRequest(model_name=entry, inputs=[pb_utils.Tensor(CONTROL_INPUT, call.row())],
                                        requested_output_names=[], parameters=peer_parameters(secret))
    for response in request.exec(decoupled=True):
        if response.has_error():
            raise EntryError(response.error().message(), pb_utils.TritonError.INTERNAL)
