"""A served TokenRouter as a benchmark target: the `tokenrouter` ensemble over gRPC streaming.

Each client thread keeps one gRPC stream open (as a streaming client would) and sends its
requests on it one after another. Tokens are stamped in the stream's callback, when the response
reaches the client. A request still running at the deadline runs to its end (Triton cancels a
request only with its whole stream); the window accounting ignores tokens after the deadline.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc as grpcclient

from tokenrouter.serving.repository import ENSEMBLE

from .records import Prompt, RequestRecord
from .targets import Spans

RESPONSE_TIMEOUT_S = 600.0


@dataclass
class _Stream:
    client: grpcclient.InferenceServerClient
    responses: queue.Queue = field(default_factory=queue.Queue)


def _tensor(name: str, array: np.ndarray) -> grpcclient.InferInput:
    dtype = "BYTES" if array.dtype == object else {np.dtype(np.int32): "INT32", np.dtype(np.uint64): "UINT64",
                                                   np.dtype(bool): "BOOL"}[array.dtype]
    tensor = grpcclient.InferInput(name, list(array.shape), dtype)
    tensor.set_data_from_numpy(array)
    return tensor


class TritonTarget:
    def __init__(self, url: str, large: str) -> None:
        self.url, self.large = url, large
        self._local = threading.local()
        self._streams: list[_Stream] = []
        self._lock = threading.Lock()
        self._ids = itertools.count()

    def _stream(self) -> _Stream:
        stream = getattr(self._local, "stream", None)
        if stream is None:
            stream = _Stream(grpcclient.InferenceServerClient(self.url))
            stream.client.start_stream(callback=lambda result, error: stream.responses.put(
                (time.monotonic(), result, error)))
            self._local.stream = stream
            with self._lock:
                self._streams.append(stream)
        return stream

    def generate(self, prompt: Prompt, *, max_tokens: int, seed: int, deadline: float) -> RequestRecord:
        if not isinstance(prompt, str):
            raise TypeError("the served ensemble takes text prompts")
        stream = self._stream()
        inputs = [_tensor("text_input", np.array([[prompt.encode()]], dtype=object)),
                  _tensor("max_tokens", np.array([[max_tokens]], dtype=np.int32)),
                  _tensor("random_seed", np.array([[seed]], dtype=np.uint64)),
                  _tensor("stream", np.array([[True]]))]
        record = RequestRecord()
        stream.client.async_stream_infer(ENSEMBLE, inputs, request_id=str(next(self._ids)),
                                         enable_empty_final_response=True)
        text, reason = [], None
        while True:
            at, result, error = stream.responses.get(timeout=RESPONSE_TIMEOUT_S)
            if error is not None:
                record.finish("error", "".join(text), str(error))
                return record
            response = result.get_response()
            if response.outputs:
                ids = result.as_numpy("output_ids").reshape(-1)
                models = [m.decode() for m in result.as_numpy("output_models").reshape(-1)]
                record.add(len(ids), models, at=at)
                text.append(result.as_numpy("text_output").reshape(-1)[0].decode("utf-8", errors="replace"))
                reason = result.as_numpy("finish_reason").reshape(-1)[0].decode() or reason
            if response.parameters["triton_final_response"].bool_param:
                record.finish(reason or "error", "".join(text))
                return record

    def step_spans(self) -> Spans:
        return {}  # the subservers run in Triton's stub processes; see the metrics port instead

    def close(self) -> None:
        with self._lock:
            streams, self._streams = self._streams, []
        for stream in streams:
            stream.client.stop_stream()
            stream.client.close()
