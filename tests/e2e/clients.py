"""Minimal clients of the `tokenrouter` ensemble, as a user would write them (tritonclient, HTTP)."""

from __future__ import annotations

import json
import queue
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tokenrouter.serving.repository import ENSEMBLE, TENSORS

NUMPY = {"TYPE_STRING": object, "TYPE_INT32": np.int32, "TYPE_FP32": np.float32, "TYPE_UINT64": np.uint64,
         "TYPE_BOOL": bool}


def grpc_inputs(**values: Any) -> list[grpcclient.InferInput]:
    """[1, n]-shaped tensors, as TensorRT-LLM clients send them."""
    inputs = []
    for name, value in values.items():
        dtype = TENSORS[name].dtype
        array = np.array(value if isinstance(value, list) else [value], dtype=NUMPY[dtype]).reshape(1, -1)
        tensor = grpcclient.InferInput(name, list(array.shape), "BYTES" if dtype == "TYPE_STRING" else dtype[5:])
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def grpc_stream(url: str, inputs: list[grpcclient.InferInput], timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """All responses of one request over the gRPC stream (the only gRPC way into a decoupled model).

    Each response is a dict of output arrays; an error raises InferenceServerException."""
    results: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(url) as client:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer(ENSEMBLE, inputs, enable_empty_final_response=True)
        responses = []
        while True:
            result, error = results.get(timeout=timeout_s)
            if error is not None:
                client.stop_stream()
                raise error
            response = result.get_response()
            if response.outputs:
                responses.append({o.name: result.as_numpy(o.name) for o in response.outputs})
            if response.parameters["triton_final_response"].bool_param:
                break
        client.stop_stream()
    return responses


def texts(responses: list[dict[str, Any]]) -> list[str]:
    return [r["text_output"].reshape(-1)[0].decode("utf-8") for r in responses]


def http_post(url: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(f"http://{url}{path}", data=json.dumps(body or {}).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, reply.read().decode("utf-8")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode("utf-8")


def http_generate(url: str, body: dict[str, Any]) -> dict[str, Any]:
    status, text = http_post(url, f"/v2/models/{ENSEMBLE}/generate", body)
    reply = json.loads(text)
    if status != 200:
        raise InferenceServerException(reply.get("error", text))
    return reply


def http_generate_stream(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Server-sent events of generate_stream, one dict per event."""
    status, text = http_post(url, f"/v2/models/{ENSEMBLE}/generate_stream", body)
    if status != 200:
        raise InferenceServerException(text)
    return [json.loads(line[len("data: "):]) for line in text.splitlines() if line.startswith("data: ")]
