"""Two guarantees of the OpenAI server held at the ASGI level, without Triton (the app is driven by
hand; Triton's gRPC channel is replaced by a generation that never ends and records when it is
closed): a client that disconnects ends its front calls, for a whole answer and for a stream, within
a second; and with an API key every route but /health refuses a request without the key (401) and
serves one with it. reliability/test_openai_cancellation.py holds the first against a real server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tokenrouter.openai_server import app as app_module
from tokenrouter.openai_server.served import ServedPair
from tokenrouter.openai_server.triton_stream import FrontReply
from tokenrouter.serving.repository import render_repository
from tokenrouter.config import load_config
from helpers.routing import routing_config

KEY = "k" * 40


@pytest.fixture(scope="module")
def served(tiny_pair: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> ServedPair:
    return ServedPair.from_repository(render_repository(load_config(routing_config(tiny_pair)),
                                                       tmp_path_factory.mktemp("openai") / "repo"))


class EndlessGeneration:
    """Stands in for TritonChannel.generate: one reply (when ``first``), then nothing ever; records
    whether the call was ended (closed or cancelled), which is what cancels the request at the front."""

    def __init__(self, first: bool) -> None:
        self.first, self.started, self.ended = first, asyncio.Event(), asyncio.Event()

    async def __call__(self, model: str, inputs: Any, outputs: Any):  # set on the class: not bound
        self.started.set()
        try:
            if self.first:
                yield FrontReply("a", 1, "", 0.0, 3, None, None, False)
            await asyncio.sleep(3600)
        finally:
            self.ended.set()


async def call(app: Any, method: str, path: str, body: dict | None, headers: dict[str, str],
               disconnect_after: asyncio.Event | None = None) -> tuple[int | None, list[dict]]:
    """One ASGI request; the client disconnects once ``disconnect_after`` is set (None: never)."""
    sent: list[dict] = []
    raw = json.dumps(body).encode() if body is not None else b""
    parts = [{"type": "http.request", "body": raw, "more_body": False}]

    async def receive() -> dict:
        if parts:
            return parts.pop(0)
        if disconnect_after is None:
            await asyncio.sleep(3600)
        await disconnect_after.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": method, "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "scheme": "http", "server": ("127.0.0.1", 9000), "client": ("127.0.0.1", 5000),
             "headers": [(k.lower().encode(), v.encode()) for k, v in
                         {"content-type": "application/json", **headers}.items()]}
    await app(scope, receive, send)
    start = next((m for m in sent if m["type"] == "http.response.start"), None)
    return (start["status"] if start else None), sent


async def with_lifespan(app: Any, work) -> Any:
    """Run ``work()`` between the app's lifespan startup and shutdown (its channel lives there)."""
    inbox: asyncio.Queue = asyncio.Queue()
    outbox: asyncio.Queue = asyncio.Queue()
    task = asyncio.ensure_future(app({"type": "lifespan", "asgi": {"version": "3.0"}}, inbox.get, outbox.put))
    await inbox.put({"type": "lifespan.startup"})
    assert (await outbox.get())["type"] == "lifespan.startup.complete"
    try:
        return await work()
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(task, 10)


@pytest.mark.parametrize("stream, first", [(False, False), (True, False), (True, True)],
                         ids=["whole", "stream-before-its-first-token", "stream-after-it"])
def test_a_client_that_disconnects_ends_its_front_call_within_a_second(served, monkeypatch, stream: bool,
                                                                        first: bool) -> None:
    """(After the first token a stream's disconnect is Starlette's to watch, as uvicorn's ASGI spec 2.3
    has it: the app only has to let the cancellation close the call.)"""
    generation = EndlessGeneration(first=first)
    monkeypatch.setattr(app_module.TritonChannel, "generate", generation)
    app = app_module.create_app(served, "127.0.0.1:1")

    async def scenario() -> float:
        gone = asyncio.Event()
        request = asyncio.ensure_future(call(app, "POST", "/v1/completions",
                                             {"model": "tokenrouter", "prompt": "def f(x):", "max_tokens": 500,
                                              "stream": stream}, {}, gone))
        await asyncio.wait_for(generation.started.wait(), 10)
        await asyncio.sleep(0.3)
        assert not generation.ended.is_set()
        gone.set()
        started = asyncio.get_running_loop().time()
        await asyncio.wait_for(generation.ended.wait(), 5)
        took = asyncio.get_running_loop().time() - started
        await asyncio.wait_for(request, 5)
        return took

    took = asyncio.run(with_lifespan(app, scenario))
    assert took < 1.0


@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer wrong"}, {"authorization": f"Basic {KEY}"},
                                     {"authorization": KEY}], ids=["none", "wrong", "basic", "bare"])
@pytest.mark.parametrize("path, body", [("/v1/models", None), ("/v1/models/tokenrouter", None),
                                        ("/v1/completions", {"model": "tokenrouter", "prompt": "x"}),
                                        ("/v1/chat/completions", {"model": "tokenrouter", "messages": []})])
def test_with_an_api_key_a_request_without_it_is_refused(served, headers, path, body) -> None:
    app = app_module.create_app(served, "127.0.0.1:1", api_key=KEY)
    status, sent = asyncio.run(call(app, "GET" if body is None else "POST", path, body, headers))
    assert status == 401, sent
    reply = json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))
    assert reply["error"]["code"] == "invalid_api_key"


def test_with_the_key_or_without_a_key_configured_the_request_is_served(served) -> None:
    for api_key, headers in ((KEY, {"authorization": f"Bearer {KEY}"}), (None, {})):
        app = app_module.create_app(served, "127.0.0.1:1", api_key=api_key)
        status, _ = asyncio.run(call(app, "GET", "/v1/models", None, headers))
        assert status == 200


def test_the_key_is_not_taken_from_a_prefix_or_case_change(served) -> None:
    app = app_module.create_app(served, "127.0.0.1:1", api_key=KEY)
    for token in (KEY[:-1], KEY + "x", KEY.upper()):
        status, _ = asyncio.run(call(app, "GET", "/v1/models", None, {"authorization": f"Bearer {token}"}))
        assert status == 401, token


