"""The OpenAI server's readiness question to Triton (``TritonChannel.ready``) against a real gRPC server
on loopback that plays Triton's health calls: ready, not ready, or holding the call unanswered (a server
shutting down)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tokenrouter.openai_server.triton_stream import TritonChannel


class Health(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, ready: bool, hold_s: float = 0.0, not_ready_model: str = "") -> None:
        self.is_ready, self.hold_s, self.not_ready_model = ready, hold_s, not_ready_model

    async def ServerReady(self, request: Any, context: Any) -> Any:
        await asyncio.sleep(self.hold_s)
        return service_pb2.ServerReadyResponse(ready=self.is_ready)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ModelReadyResponse(ready=request.name != self.not_ready_model)


async def _ask(health: Health, models: list[str]) -> tuple[bool, float]:
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(health, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        channel = TritonChannel(f"127.0.0.1:{port}")
        await channel.ready(models)  # the connection's set-up, not the probe, is out of the timing
        started = time.monotonic()
        answer = await channel.ready(models)
        return answer, time.monotonic() - started
    finally:
        await server.stop(None)


def test_a_ready_server_and_models_read_ready() -> None:
    assert asyncio.run(_ask(Health(ready=True), ["a", "b"]))[0] is True


def test_a_model_not_ready_reads_not_ready() -> None:
    assert asyncio.run(_ask(Health(ready=True, not_ready_model="b"), ["a", "b"]))[0] is False


def test_a_server_that_holds_the_call_reads_not_ready_at_once() -> None:
    """Catches a probe that waits on a held call (it answered /health after a second, past a test's bound)."""
    ready, took = asyncio.run(_ask(Health(ready=True, hold_s=5.0), ["a"]))
    assert ready is False and took < 0.5
