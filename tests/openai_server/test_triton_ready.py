"""The OpenAI server's readiness question to Triton (``TritonChannel.ready``) against a real gRPC server
on loopback that plays Triton's health calls: ready, or a model not ready."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tokenrouter.openai_server.triton_stream import TritonChannel


class Health(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, ready: bool, not_ready_model: str = "") -> None:
        self.is_ready, self.not_ready_model = ready, not_ready_model

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=self.is_ready)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ModelReadyResponse(ready=request.name != self.not_ready_model)


async def _ask(health: Health, models: list[str]) -> bool:
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(health, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        return await TritonChannel(f"127.0.0.1:{port}").ready(models)
    finally:
        await server.stop(None)


def test_a_ready_server_and_models_read_ready() -> None:
    assert asyncio.run(_ask(Health(ready=True), ["a", "b"])) is True


def test_a_model_not_ready_reads_not_ready() -> None:
    assert asyncio.run(_ask(Health(ready=True, not_ready_model="b"), ["a", "b"])) is False


def test_a_server_not_ready_reads_not_ready() -> None:
    assert asyncio.run(_ask(Health(ready=False), ["a"])) is False
