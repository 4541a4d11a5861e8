"""The fronts over Triton's gRPC stream: one channel for the whole server, one stream per generation.

A generation is one ``ModelStreamInfer`` call on the shared channel (HTTP/2 multiplexes them), so
ending it early is cancelling that call: Triton marks the front's request cancelled and the front
ends it on every model (docs/reliability.md). Requests and responses are built from the tensor
schema (serving/schema.py) straight into Triton's protobuf messages; only the outputs a generation
reads are asked for, since every tensor costs in every process it crosses.

Errors: a front asked with ``tokenrouter_error_codes`` names its Triton code in the message
(serving/error_codes.py); an error from Triton itself (a front not loaded, the server stopping)
carries none, and a failed call carries gRPC's status.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator, Mapping, Sequence

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import serialize_byte_tensor

from ..serving.error_codes import ERROR_CODES_PARAMETER, split_coded
from ..serving.schema import CLIENT_INPUTS

MAX_MESSAGE_BYTES = 256 * 1024 * 1024  # a whole non-streamed text, or a long prompt
NUMPY = {"BOOL": np.bool_, "INT32": np.int32, "INT64": np.int64, "UINT64": np.uint64, "FP32": np.float32}


class TritonCallError(Exception):
    """A generation that failed: ``code`` is Triton's error code name (INVALID_ARG, UNAVAILABLE, ...),
    None when Triton itself refused without one."""

    def __init__(self, code: str | None, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


@dataclass
class FrontReply:
    """One response of a front (one generation's chunk)."""

    text: str
    tokens: int  # output tokens in this response
    finish_reason: str  # "" until the last response
    large_share: float  # of the output so far
    prompt_tokens: int | None
    token_ids: np.ndarray | None  # when asked (logprobs)
    log_probs: np.ndarray | None  # when asked
    final: bool


def infer_request(model: str, inputs: Mapping[str, np.ndarray],
                  outputs: Sequence[str]) -> service_pb2.ModelInferRequest:
    """A front's request: ``inputs`` by name, each one batch row of the schema's dtype."""
    request = service_pb2.ModelInferRequest(model_name=model)
    for name, array in inputs.items():
        tensor = request.inputs.add()
        tensor.name, tensor.datatype = name, CLIENT_INPUTS[name].datatype
        tensor.shape.extend(array.shape)
        raw = serialize_byte_tensor(array).item() if array.dtype == np.object_ else array.tobytes()
        request.raw_input_contents.append(raw)
    for name in outputs:
        request.outputs.add().name = name
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    request.parameters[ERROR_CODES_PARAMETER].bool_param = True
    return request


def _one_string(raw: bytes) -> bytes:
    """The one element of a serialized BYTES tensor of one element (a 4-byte length, then the
    bytes): each front output read here holds one string, and this is a third of the general
    deserializer's cost on every response."""
    return raw[4:]


def _reply(response: service_pb2.ModelInferResponse) -> FrontReply | None:
    final = response.parameters["triton_final_response"].bool_param
    if not response.outputs:
        return FrontReply("", 0, "", 0.0, None, None, None, True) if final else None
    values = {}
    for tensor, raw in zip(response.outputs, response.raw_output_contents):
        if tensor.datatype == "BYTES":
            values[tensor.name] = _one_string(raw)
        else:
            values[tensor.name] = np.frombuffer(raw, NUMPY[tensor.datatype])
    ids = values.get("output_ids")
    prompt = values.get("num_input_tokens")
    return FrontReply(
        text=values["text_output"].decode("utf-8"),
        tokens=int(values["num_output_tokens"][0]) if ids is None else ids.size,
        finish_reason=values["finish_reason"].decode(),
        large_share=float(values["large_model_share"][0]),
        prompt_tokens=None if prompt is None else int(prompt[0]),
        token_ids=ids, log_probs=values.get("output_log_probs"), final=final)


class TritonChannel:
    """One gRPC channel to Triton, shared by every request of the server (created on its event loop)."""

    def __init__(self, url: str) -> None:
        self._channel = grpc.aio.insecure_channel(url, options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                                                                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)])
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)

    async def ready(self, models: Sequence[str], timeout_s: float = 2.0) -> bool:
        """Whether Triton is ready and so is each of ``models``."""
        try:
            if not (await self._stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=timeout_s)).ready:
                return False
            for model in models:
                reply = await self._stub.ModelReady(service_pb2.ModelReadyRequest(name=model), timeout=timeout_s)
                if not reply.ready:
                    return False
            return True
        except grpc.aio.AioRpcError:
            return False

    async def generate(self, model: str, inputs: Mapping[str, np.ndarray],
                       outputs: Sequence[str]) -> AsyncIterator[FrontReply]:
        """The front's responses to one request, up to the final one. Leaving the loop early (or
        being cancelled) cancels the call, and with it the request on every model."""
        call = self._stub.ModelStreamInfer(iter([infer_request(model, inputs, outputs)]))
        try:
            async for response in call:
                if response.error_message:
                    raise TritonCallError(*split_coded(response.error_message))
                reply = _reply(response.infer_response)
                if reply is not None:
                    yield reply
                    if reply.final:
                        return
            raise TritonCallError("UNAVAILABLE", f"Triton closed the stream of '{model}' before its final response")
        except grpc.aio.AioRpcError as failed:
            code = "UNAVAILABLE" if failed.code() == grpc.StatusCode.UNAVAILABLE else failed.code().name
            raise TritonCallError(code, f"Triton: {failed.details()}") from None
        finally:
            call.cancel()  # a no-op once the call is done

    async def close(self) -> None:
        await self._channel.close()
