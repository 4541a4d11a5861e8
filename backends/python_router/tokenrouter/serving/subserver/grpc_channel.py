"""A peer link's stream (peer_link.py): Triton's own ModelStreamInfer, from this subserver's stub
into the peer subserver model on the other server, through grpcio and Triton's service stubs.

Each link call is one ModelInferRequest to the peer model with the ``peer_message`` input (one
BYTES element: the JSON batch) and the link's parameters; its id is the batch's number, which the
peer's answer (an empty final response, or an error) echoes. Why this and not a grpcio service of
our own: docs/runtime.md, "Between subservers" (measured: tools/bench/peer_channel.py).
"""

from __future__ import annotations

import logging
import queue
import struct
import threading
from typing import Callable

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from ..schema import PEER_INPUT
from .sending_session import Channel, OpenChannel

log = logging.getLogger(__name__)


class TritonStream:
    def __init__(self, address: str, model: str, on_answer: Callable[[int | None, str | None], None],
                 on_broken: Callable[[str], None]) -> None:
        self._model = model
        self._closed = False
        self._requests: queue.Queue = queue.Queue()
        self._channel = grpc.insecure_channel(address)  # between hosts: a tunnel's job (docs/deploy.md)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        self._call = stub.ModelStreamInfer(iter(self._requests.get, None))
        threading.Thread(target=self._read, args=(on_answer, on_broken), name=f"stream-from-{model}",
                         daemon=True).start()

    def send(self, number: int, payload: bytes, parameters: dict[str, str]) -> None:
        request = service_pb2.ModelInferRequest(model_name=self._model, id=str(number))
        for key, value in parameters.items():
            request.parameters[key].string_param = value
        request.parameters["triton_enable_empty_final_response"].bool_param = True  # the answer
        request.inputs.add(name=PEER_INPUT, datatype="BYTES", shape=[1, 1])
        request.raw_input_contents.append(struct.pack("<I", len(payload)) + payload)  # BYTES: length, then bytes
        self._requests.put(request)

    def close(self) -> None:
        self._closed = True
        self._requests.put(None)
        self._call.cancel()
        self._channel.close()

    def _read(self, on_answer: Callable[[int | None, str | None], None], on_broken: Callable[[str], None]) -> None:
        try:
            for response in self._call:
                answer = response.infer_response
                if not response.error_message and not answer.parameters["triton_final_response"].bool_param:
                    continue  # (a peer model answers once, with its final response)
                number = int(answer.id) if answer.id.isdigit() else None
                on_answer(number, response.error_message or None)
            reason = "the server ended the stream"
        except grpc.RpcError as error:
            reason = f"{error.code().name}: {error.details()}"
        except Exception as error:  # noqa: BLE001 - whatever ends the reader ends the stream
            log.exception("reading the stream from %s failed", self._model)
            reason = f"{type(error).__name__}: {error}"
        if not self._closed:
            on_broken(reason)


def stream_opener(address: str, model: str) -> OpenChannel:
    """Opens TritonStreams to ``model`` at ``address``."""

    def open_stream(on_answer: Callable[[int | None, str | None], None], on_broken: Callable[[str], None]) -> Channel:
        return TritonStream(address, model, on_answer, on_broken)

    return open_stream
