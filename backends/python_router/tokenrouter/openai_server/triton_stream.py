"""The fronts over Triton's gRPC stream: one channel for the whole server, one generation at a time per stream.

A generation is one request on a ``ModelStreamInfer`` call of the shared channel (HTTP/2
multiplexes the calls). A call never carries two generations at once, so ending one early is
cancelling its call: Triton marks the front's request cancelled and the front ends it on every
model (docs/reliability.md). A call whose generation ended with its final response is kept and
carries a later generation to the same front (``IdleStreams``): opening a call per request cost
the first token a few milliseconds at N = 64 (docs/benchmarks.md, "The OpenAI path").

Requests and responses are built from the tensor schema (serving/schema.py) straight into Triton's
protobuf messages; only the outputs a generation reads are asked for, since every tensor costs in
every process it crosses.

Errors: a front asked with ``tokenrouter_error_codes`` names its Triton code in the message
(serving/error_codes.py); an error from Triton itself (a front not loaded, the server stopping)
carries none, and a failed call carries gRPC's status.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, AsyncGenerator, Mapping, Sequence

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
    strings: dict[str, bytes] = {}
    values: dict[str, np.ndarray] = {}
    for tensor, raw in zip(response.outputs, response.raw_output_contents):
        if tensor.datatype == "BYTES":
            strings[tensor.name] = _one_string(raw)
        else:
            values[tensor.name] = np.frombuffer(raw, NUMPY[tensor.datatype])
    ids = values.get("output_ids")
    prompt = values.get("num_input_tokens")
    return FrontReply(
        text=strings["text_output"].decode("utf-8"),
        tokens=int(values["num_output_tokens"][0]) if ids is None else ids.size,
        finish_reason=strings["finish_reason"].decode(),
        large_share=float(values["large_model_share"][0]),
        prompt_tokens=None if prompt is None else int(prompt[0]),
        token_ids=ids, log_probs=values.get("output_log_probs"), final=final)


@dataclass(eq=False)  # compared by identity: two idle calls are never the same entry
class _IdleCall:
    call: Any
    closing: asyncio.TimerHandle | None = None  # set by IdleStreams.keep right after the entry is made

    def cancel_timer(self) -> None:
        if self.closing is not None:
            self.closing.cancel()


class IdleStreams:
    """``ModelStreamInfer`` calls between generations, per front, each closed after ``idle_s`` unused.

    Closing them soon matters beyond memory: Triton 2.51 holds a front loaded while a stream whose
    first request went to it stays open (docs/reliability.md, known limits), so a front being
    unloaded waits at most ``idle_s`` for this server, less than the supervisor waits before it
    heals a stuck unload with a restart (10 s, launch/supervisor.py ``NOT_READY_S``). A call that
    ended meanwhile (Triton restarted) is never handed out again."""

    def __init__(self, idle_s: float) -> None:
        self.idle_s = idle_s
        self._idle: dict[str, list[_IdleCall]] = {}

    def take(self, model: str) -> Any | None:
        idle = self._idle.get(model, [])
        while idle:
            entry = idle.pop()  # the one used last, so that the others age out under a light load
            entry.cancel_timer()
            if not entry.call.done():
                return entry.call
        return None

    def keep(self, model: str, call: Any) -> None:
        entry = _IdleCall(call)
        entry.closing = asyncio.get_running_loop().call_later(self.idle_s, self._expire, model, entry)
        self._idle.setdefault(model, []).append(entry)

    def _expire(self, model: str, entry: _IdleCall) -> None:
        self._idle[model].remove(entry)
        entry.call.cancel()  # nothing is in flight on it: Triton just ends the call

    def close(self) -> None:
        for entry in (entry for idle in self._idle.values() for entry in idle):
            entry.cancel_timer()
            entry.call.cancel()
        self._idle.clear()

    def __len__(self) -> int:
        return sum(len(idle) for idle in self._idle.values())


class TritonChannel:
    """One gRPC channel to Triton, shared by every request of the server (created on its event loop)."""

    IDLE_STREAM_S = 5.0

    def __init__(self, url: str) -> None:
        self._channel = grpc.aio.insecure_channel(url, options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                                                                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)])
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        self.idle_streams = IdleStreams(self.IDLE_STREAM_S)

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
                       outputs: Sequence[str]) -> AsyncGenerator[FrontReply, None]:
        """The front's responses to one request, up to the final one. Leaving the loop early (or
        being cancelled) cancels the call, and with it the request on every model; after the final
        response the call is kept for the next generation to ``model``."""
        call = self.idle_streams.take(model) or self._stub.ModelStreamInfer()
        ended = False  # with the final response: nothing of this generation is left on the call
        try:
            await call.write(infer_request(model, inputs, outputs))
            while (response := await call.read()) is not grpc.aio.EOF:
                if response.error_message:
                    raise TritonCallError(*split_coded(response.error_message))
                reply = _reply(response.infer_response)
                if reply is not None:
                    ended = reply.final
                    yield reply
                    if ended:
                        return
            raise TritonCallError("UNAVAILABLE", f"Triton closed the stream of '{model}' before its final response")
        except grpc.aio.AioRpcError as failed:
            code = "UNAVAILABLE" if failed.code() == grpc.StatusCode.UNAVAILABLE else failed.code().name
            raise TritonCallError(code, f"Triton: {failed.details()}") from None
        finally:
            if ended:
                self.idle_streams.keep(model, call)
            else:
                call.cancel()  # a no-op once the call is done

    async def close(self) -> None:
        self.idle_streams.close()
        await self._channel.close()

