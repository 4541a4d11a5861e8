"""The OpenAI server's app over a fake Triton channel, driven in-process through httpx's ASGI transport."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Mapping, Sequence

import httpx
import numpy as np

from tokenrouter.openai_server.app import create_app
from tokenrouter.openai_server.served import ServedPair
from tokenrouter.openai_server.triton_stream import FrontReply, infer_request
from tokenrouter.text import TextCodec

FRONT = "tokenrouter"


class FakeChannel:
    """Answers every generation with one final reply ("ok", one token, finished by length) and keeps
    the inputs each one was sent, as the fronts' tensors. Each request is built as the real channel
    builds it (serialized to Triton's protobuf), so what could not cross the wire fails here too."""

    def __init__(self, url: str) -> None:
        self.sent: list[dict[str, np.ndarray]] = []

    async def ready(self, models: Sequence[str]) -> bool:
        return True

    async def generate(self, model: str, inputs: Mapping[str, np.ndarray],
                       outputs: Sequence[str]) -> AsyncIterator[FrontReply]:
        infer_request(model, inputs, outputs)
        self.sent.append(dict(inputs))
        yield FrontReply("ok", 1, "length", 0.0, 3, None, None, True)

    async def close(self) -> None:
        pass


def served_pair(codec: TextCodec, context_limit: int = 4096, max_prompt_bytes: int = 32 * 4096,
                max_body_bytes: int = 1 << 20) -> ServedPair:
    """The tiny pair as the OpenAI server sees it (defaults: the tiny pair's own limits)."""
    return ServedPair(fronts=(FRONT,), policy="random", codec=codec, chat_end_ids=codec.end_ids(),
                      context_limit=context_limit, max_choices=16, max_generations=64,
                      max_prompt_bytes=max_prompt_bytes, max_body_bytes=max_body_bytes, created=0)


@asynccontextmanager
async def openai_app(served: ServedPair) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    """An httpx client on the app (its lifespan run: the fake channel is the app's) and the channel."""
    channels: list[FakeChannel] = []

    def connect(url: str) -> FakeChannel:
        channels.append(FakeChannel(url))
        return channels[-1]

    app = create_app(served, "fake:0", connect=connect)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://openai",
                                     timeout=60) as client:
            yield client, channels[0]
