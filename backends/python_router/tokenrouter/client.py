"""A small client of a served TokenRouter: TensorRT-LLM-shaped requests over gRPC and HTTP.

The tests, the locustfile and the benchmark's Triton target all use it, with the one tensor schema
the server is rendered from (serving/schema.py). tritonclient is imported here, never in a server
process::

    from tokenrouter import client
    replies = client.grpc_stream("localhost:8001", client.inputs(text_input="def f(x):", max_tokens=32, stream=True))
    print("".join(reply.text for reply in replies))
"""

from __future__ import annotations

import http.client
import json
import queue
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from .serving.schema import CLIENT_INPUTS, SUBSERVER_INPUTS

DEFAULT_MODEL = "tokenrouter"
# The fronts' inputs, and the subservers' (only this server's own models may send those: tests check the refusals).
TENSORS = {**SUBSERVER_INPUTS, **CLIENT_INPUTS}


def inputs(**values: Any) -> dict[str, np.ndarray]:
    """One request's inputs as TensorRT-LLM clients send them: each value one batch row ``[1, n]``
    of the dtype the server declares (``text_input="hi"``, ``max_tokens=8``, ``stop_words=["\\n"]``)."""
    return {name: TENSORS[name].row(value) for name, value in values.items()}


def batch(*rows: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Several requests' inputs as one batch (the same names in every row, rows of equal shape)."""
    return {name: np.concatenate([row[name] for row in rows]) for name in rows[0]}


def _typed(module: Any, arrays: Mapping[str, np.ndarray]) -> list[Any]:
    """Typed tensors; an array's own dtype says its datatype (a test may send a wrong one on purpose)."""
    tensors = []
    for name, array in arrays.items():
        tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


def grpc_inputs(arrays: Mapping[str, np.ndarray]) -> list[grpcclient.InferInput]:
    return _typed(grpcclient, arrays)


@dataclass
class Reply(Mapping):
    """One response: its outputs by name (``reply["output_ids"]``), when it arrived, whether it is the last."""

    outputs: dict[str, np.ndarray]
    final: bool = True
    at: float = 0.0

    def __getitem__(self, name: str) -> np.ndarray:
        return self.outputs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.outputs)

    def __len__(self) -> int:
        return len(self.outputs)

    @property
    def text(self) -> str:
        return self.outputs["text_output"][0].decode("utf-8")

    @property
    def ids(self) -> list[int]:
        return self.outputs["output_ids"].reshape(-1).tolist()

    @property
    def models(self) -> list[str]:
        return [m.decode() for m in self.outputs["output_models"].reshape(-1)]

    @property
    def finish_reason(self) -> str:
        return self.outputs["finish_reason"].reshape(-1)[0].decode()

    @property
    def large_share(self) -> float:
        return float(self.outputs["large_model_share"].reshape(-1)[0])


class GrpcStream:
    """One gRPC stream kept open, requests sent on it one after another (as a streaming client
    does); each response is stamped by ``clock`` when it reaches the client's callback."""

    def __init__(self, url: str, *, clock: Callable[[], float] = time.monotonic,
                 stream_timeout_s: float | None = None) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self._replies: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self._replies.put((clock(), result, error)),
                                 stream_timeout=stream_timeout_s)

    def send(self, arrays: Mapping[str, np.ndarray], model: str = DEFAULT_MODEL, request_id: str = "",
             parameters: Mapping[str, Any] | None = None, outputs: Sequence[str] | None = None) -> None:
        """Send one request; ``parameters``: Triton request parameters (none by default);
        ``outputs``: the outputs wanted (None: all of them)."""
        wanted = None if outputs is None else [grpcclient.InferRequestedOutput(name) for name in outputs]
        self.client.async_stream_infer(model, grpc_inputs(arrays), outputs=wanted, request_id=request_id,
                                       enable_empty_final_response=True, parameters=parameters)

    def replies(self, timeout_s: float = 60.0) -> Iterator[Reply]:
        """The responses of the request sent last, up to its final one; raises its error."""
        while True:
            at, result, error = self._replies.get(timeout=timeout_s)
            if error is not None:
                raise error
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            outputs = {o.name: result.as_numpy(o.name) for o in response.outputs}
            if outputs or final:
                yield Reply(outputs, final, at)
            if final:
                return

    def request(self, arrays: Mapping[str, np.ndarray], model: str = DEFAULT_MODEL, timeout_s: float = 60.0,
                parameters: Mapping[str, Any] | None = None) -> list[Reply]:
        """Every response with outputs of one request (an empty FINAL is not one)."""
        self.send(arrays, model, parameters=parameters)
        return [reply for reply in self.replies(timeout_s) if reply.outputs]

    def cancel(self) -> None:
        """Cancel what is in flight on this stream and close it (the server sees a cancellation)."""
        self.client.stop_stream(cancel_requests=True)

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def grpc_stream(url: str, arrays: Mapping[str, np.ndarray], model: str = DEFAULT_MODEL, timeout_s: float = 60.0,
                parameters: Mapping[str, Any] | None = None) -> list[Reply]:
    """One request over a gRPC stream of its own (the only gRPC way into a decoupled front)."""
    stream = GrpcStream(url)
    try:
        return stream.request(arrays, model, timeout_s, parameters)
    finally:
        stream.close()


def grpc_infer(url: str, arrays: Mapping[str, np.ndarray], model: str = DEFAULT_MODEL,
               timeout_s: float | None = None) -> Reply:
    """A unary ModelInfer (a unary front); ``timeout_s`` is the client's deadline."""
    with grpcclient.InferenceServerClient(url) as client:
        result = client.infer(model, grpc_inputs(arrays), client_timeout=timeout_s)
        return Reply({o.name: result.as_numpy(o.name) for o in result.get_response().outputs})


def http_infer(url: str, arrays: Mapping[str, np.ndarray], model: str = DEFAULT_MODEL) -> Reply:
    """HTTP /v2/models/<model>/infer (a unary front)."""
    with httpclient.InferenceServerClient(url) as client:
        result = client.infer(model, _typed(httpclient, arrays))
        return Reply({o["name"]: result.as_numpy(o["name"]) for o in result.get_response()["outputs"]})


def http_post(url: str, path: str, body: Any = None, timeout_s: float = 60.0,
              headers: Mapping[str, str] | None = None) -> tuple[int, str]:
    """POST a JSON body (with extra ``headers``); returns (status, text) whatever the status."""
    host, port = url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
    try:
        connection.request("POST", path, body=json.dumps(body if body is not None else {}),
                           headers={"Content-Type": "application/json", **(headers or {})})
        reply = connection.getresponse()
        return reply.status, reply.read().decode("utf-8")
    finally:
        connection.close()


def http_generate(url: str, body: Mapping[str, Any], model: str = DEFAULT_MODEL) -> dict[str, Any]:
    """HTTP generate: one JSON reply; an error status raises InferenceServerException."""
    status, text = http_post(url, f"/v2/models/{model}/generate", dict(body))
    reply = json.loads(text)
    if status != 200:
        raise InferenceServerException(reply.get("error", text))
    return reply


def http_generate_stream(url: str, body: Mapping[str, Any], model: str = DEFAULT_MODEL,
                         timeout_s: float = 60.0) -> Iterator[dict[str, Any]]:
    """HTTP generate_stream's server-sent events as they arrive, one dict each; an error event
    raises InferenceServerException. Closing the iterator early drops the connection."""
    host, port = url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
    try:
        connection.request("POST", f"/v2/models/{model}/generate_stream", body=json.dumps(dict(body)),
                           headers={"Content-Type": "application/json"})
        reply = connection.getresponse()
        if reply.status != 200:
            raise InferenceServerException(reply.read().decode("utf-8"))
        for line in reply:
            if line.startswith(b"data: "):
                event = json.loads(line[len(b"data: "):])
                if "error" in event:
                    raise InferenceServerException(event["error"])
                yield event
    finally:
        connection.close()
