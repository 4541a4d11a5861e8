"""A front's calls to the entry subserver, by BLS: one generation's stream, and cancelling by key.

Both carry this server start's secret (peer_auth.py). The stream is a blocking decoupled
``exec`` iterated on the generation's own thread: a BLS ResponseIterator is synchronous, and
Triton 2.51's stub has no way to cancel it, hence the control call that names the request.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import numpy as np

from .bls_transport import PEER_INPUT
from .error_codes import code_of
from .front_outputs import EntryChunk
from .peer_auth import cancel_parameters
from .schema import SUBSERVER_INPUTS, SUBSERVER_OUTPUTS


class EntryError(Exception):
    """The entry subserver answered a generation with an error (``code``: Triton's error code)."""

    def __init__(self, message: str, code: Any) -> None:
        super().__init__(message)
        self.code = code


def stream_from_entry(pb_utils: Any, entry: str, inputs: Mapping[str, np.ndarray],
                      parameters: Mapping[str, str]) -> Iterator[EntryChunk]:
    """The entry's chunks for one generation, the last one final; raises EntryError, also for an
    error the entry sent as data (error_codes.py)."""
    request = pb_utils.InferenceRequest(model_name=entry, inputs=[pb_utils.Tensor(n, a) for n, a in inputs.items()],
                                        requested_output_names=list(SUBSERVER_OUTPUTS), parameters=dict(parameters))
    for response in request.exec(decoupled=True):
        if response.has_error():  # only as the first response: Triton loses later ones (error_codes.py)
            raise EntryError(response.error().message(), pb_utils.TritonError.INTERNAL)
        outputs = {tensor.name(): tensor.as_numpy() for tensor in response.output_tensors()}
        if not outputs:  # the entry's first, empty response, or an empty FINAL
            continue
        chunk = EntryChunk.of(outputs)
        if chunk.finish_reason == "error":
            raise EntryError(chunk.error, code_of(pb_utils, chunk.error_code))
        yield chunk


def cancel_at_entry(pb_utils: Any, entry: str, secret: str, keys: list[str]) -> None:
    """End the entry's requests that a front named ``keys`` (each then answers 'cancelled')."""
    payload = SUBSERVER_INPUTS[PEER_INPUT].row(b"[]")
    request = pb_utils.InferenceRequest(model_name=entry, inputs=[pb_utils.Tensor(PEER_INPUT, payload)],
                                        requested_output_names=[], parameters=cancel_parameters(secret, keys))
    for response in request.exec(decoupled=True):
        if response.has_error():
            raise EntryError(response.error().message(), pb_utils.TritonError.INTERNAL)
