"""The OpenAI-compatible HTTP API (Starlette): /v1/chat/completions, /v1/completions, /v1/models,
/health, on the fronts of one TokenRouter repository through Triton's gRPC stream.

Each route checks the API key (when one is set), reads the body under a byte cap before parsing
it, checks the request (requests.py), turns it into one front call per choice (translate.py) and
answers as OpenAI does, streamed (SSE) or whole (responses.py). A client that goes away, mid-stream
or while waiting for a whole answer, ends its calls at once, and with them the work on every model.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import re
from collections.abc import MutableMapping
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

from jinja2 import TemplateError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from . import translate
from .errors import OpenAIError, bad_request
from .generation import ChoiceRun, Piece, merged, usage
from .prompt_tokens import PromptCounter
from .requests import ChatRequest, CompletionRequest, limit_choices, lone_surrogate_path, model_not_found, parse
from .responses import (DONE, POLICY_HEADER, ChatChunks, ChoiceText, CompletionChunks, Envelope, chat_body,
                        completion_body, event)
from .served import ServedPair
from .triton_stream import TritonChannel

log = logging.getLogger(__name__)
API_KEY_ENV = "TOKENROUTER_API_KEY"  # the key itself (the caller's environment)
API_KEY_FILE_ENV = "TOKENROUTER_API_KEY_FILE"  # or a file that holds it (a mounted Docker/Kubernetes secret)


def read_api_key(path: str | Path | None) -> str | None:
    """The OpenAI API's key: the content of ``path`` when given, else ``$TOKENROUTER_API_KEY``; None: no key.
    Never an argument of its own: a command line is readable by every local user (/proc/<pid>/cmdline)."""
    if path:
        try:
            key = Path(path).read_text().strip()
        except OSError as err:
            raise ValueError(f"the API key file {path}: cannot read it ({err.strerror})") from None
        if not key:
            raise ValueError(f"the API key file {path} is empty")
        return key
    return os.environ.get(API_KEY_ENV) or None
TOKENIZING_WORKERS = max(1, min(4, (os.cpu_count() or 2) // 2))  # long prompts' counting: a core or so each


class ClientGone(Exception):
    """The client closed its connection before its answer was ready."""


async def _disconnected(receive: Callable[[], Awaitable[MutableMapping[str, Any]]]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnected(request: Request, work: Awaitable[Any]) -> Any:
    """``work``'s result, or ClientGone as soon as the client disconnects (``work`` is cancelled,
    which ends its front calls). Starlette watches a streaming response itself; this covers the
    wait before one, and whole answers."""
    task, gone = asyncio.ensure_future(work), asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, gone):
            if not pending.done():
                pending.cancel()
        await asyncio.gather(gone, return_exceptions=True)
    if task.cancelled() or not task.done():
        await asyncio.gather(task, return_exceptions=True)
        raise ClientGone()
    return task.result()


async def read_json(request: Request, max_bytes: int) -> Any:
    """The body as JSON, refused (413) as soon as it passes ``max_bytes``: never read whole first."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > max_bytes):
        raise OpenAIError(413, f"the request body is over the limit of {max_bytes} bytes", code="request_too_large")
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > max_bytes:
            raise OpenAIError(413, f"the request body is over the limit of {max_bytes} bytes",
                              code="request_too_large")
        parts.append(part)
    raw = b"".join(parts)
    try:
        body = json.loads(raw, parse_constant=_not_json)
    except ValueError as err:
        raise bad_request(f"the request body is not valid JSON: {err}") from None
    except RecursionError:  # "[[[[...": nested deeper than the parser goes
        raise bad_request("the request body is nested too deeply") from None
    # only an escape decodes to a surrogate (raw UTF-8 cannot hold one): the walk runs only then
    if SURROGATE_ESCAPE.search(raw) and (path := lone_surrogate_path(body)) is not None:
        param = ".".join(str(part) for part in path) or None
        raise bad_request(f"{param or 'the request body'}: the text is not valid Unicode (a lone surrogate: a \\u "
                          "escape of half a UTF-16 pair)", param=param, code="invalid_unicode")
    return body


SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _not_json(constant: str) -> None:
    raise ValueError(f"{constant} is not a JSON value")


class OpenAIRoutes:
    def __init__(self, served: ServedPair, triton_url: str, api_key: str | None,
                 connect: Callable[[str], TritonChannel]) -> None:
        self.served, self._triton_url, self._api_key, self._connect = served, triton_url, api_key or None, connect
        self.channel: TritonChannel | None = None  # open for the app's lifespan
        self._headers = {POLICY_HEADER: served.policy}
        self.prompt_counter = PromptCounter(served.codec, served.max_prompt_bytes, TOKENIZING_WORKERS)

    def _open_channel(self) -> TritonChannel:
        if self.channel is None:
            raise RuntimeError("the channel to Triton is open only while the app runs (its lifespan)")
        return self.channel

    def _token_text(self, token: int) -> str:
        return self.served.codec.decode([token])

    def _authorize(self, request: Request) -> None:
        if self._api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self._api_key.encode()):
            raise OpenAIError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>' with the key this "
                              "server was started with", code="invalid_api_key")

    async def _request(self, request: Request, model: type, prompts_of: Callable[[Any], list[str]]) -> Any:
        self._authorize(request)
        body = parse(model, await read_json(request, self.served.max_body_bytes))
        body.check()
        if body.model not in self.served.fronts:
            raise model_not_found(body.model, self.served.fronts)
        limit_choices(body.n, len(prompts_of(body)), self.served.max_choices, self.served.max_generations)
        return body

    async def health(self, request: Request) -> Response:
        ready = await self._open_channel().ready(self.served.fronts)
        return JSONResponse({"status": "ok" if ready else "unavailable"}, status_code=200 if ready else 503)

    async def models(self, request: Request) -> Response:
        self._authorize(request)
        return JSONResponse({"object": "list", "data": self.served.models()})

    async def model(self, request: Request) -> Response:
        self._authorize(request)
        name = request.path_params["model"]
        found = [model for model in self.served.models() if model["id"] == name]
        if not found:
            raise model_not_found(name, self.served.fronts)
        return JSONResponse(found[0])

    async def chat(self, request: Request) -> Response:
        body: ChatRequest = await self._request(request, ChatRequest, lambda _: [""])
        if not self.served.has_chat_template:
            raise bad_request("this model pair's tokenizer has no chat template: use /v1/completions", param="messages")
        try:
            prompt = self.served.render_chat([message.as_template_turn() for message in body.messages])
        except TemplateError as err:  # the template refuses the conversation (e.g. turns out of order)
            raise bad_request(f"the model's chat template refused the messages: {err}", param="messages") from None
        max_tokens = body.output_cap()
        if max_tokens is None:  # OpenAI's default: as many as the context holds
            max_tokens = self.served.context_limit - await until_disconnected(
                request, self.prompt_counter.count(prompt, "messages"))
            if max_tokens < 1:
                raise bad_request(f"the messages fill the context of {self.served.context_limit} tokens",
                                  param="messages", code="context_length_exceeded")
        runs = self._runs(body, [prompt], max_tokens, body.logprobs, self.served.chat_end_ids, translate.PARAMS)
        if body.stream:
            chunks = ChatChunks(Envelope.new("chat.completion.chunk", body.model, self.served.policy),
                                self._token_text, self._include_usage(body))
            return await self._stream(request, runs, body.n, [chunks.role(run.choice.index) for run in runs], chunks,
                                      self._continuous_usage(body))
        choices = await until_disconnected(request, self._whole(runs))
        envelope = Envelope.new("chat.completion", body.model, self.served.policy)
        return JSONResponse(chat_body(envelope, choices, usage(runs, body.n), body.logprobs, self._token_text),
                            headers=self._headers)

    async def completions(self, request: Request) -> Response:
        body: CompletionRequest = await self._request(request, CompletionRequest, CompletionRequest.prompts)
        logprobs = body.logprobs is not None
        runs = self._runs(body, body.prompts(), body.max_tokens, logprobs, None, translate.COMPLETION_PARAMS)
        echoed = {run.choice.index: run.choice.prompt for run in runs} if body.echo else {}
        if body.stream:
            chunks = CompletionChunks(Envelope.new("text_completion", body.model, self.served.policy),
                                      self._token_text, self._include_usage(body))
            return await self._stream(request, runs, body.n, [chunks.echo(i, p) for i, p in echoed.items()], chunks,
                                      self._continuous_usage(body))
        choices = await until_disconnected(request, self._whole(runs))
        envelope = Envelope.new("text_completion", body.model, self.served.policy)
        return JSONResponse(completion_body(envelope, choices, usage(runs, body.n), logprobs, self._token_text,
                                            echoed), headers=self._headers)

    @staticmethod
    def _include_usage(body: Any) -> bool:
        return bool(body.stream_options and body.stream_options.include_usage)

    @staticmethod
    def _continuous_usage(body: Any) -> bool:
        return bool(body.stream_options and body.stream_options.continuous_usage_stats)

    def _runs(self, body: Any, prompts: list[str], max_tokens: int, logprobs: bool, end_ids: list[int] | None,
              params: dict[str, str]) -> list[ChoiceRun]:
        stops = body.stop_strings()
        min_tokens = max_tokens if body.ignore_eos else body.min_tokens  # vLLM's ignore_eos, in the fronts' terms
        sampling = translate.Sampling(max_tokens, body.temperature, body.top_p, body.seed, stops, body.presence_penalty,
                                      body.frequency_penalty, logprobs, body.top_k, min_tokens,
                                      body.repetition_penalty, body.stream, end_ids)
        channel = self._open_channel()
        return [ChoiceRun(channel, body.model, choice, stops, params)
                for choice in translate.choices(prompts, body.n, sampling)]

    @staticmethod
    async def _whole(runs: Sequence[ChoiceRun]) -> list[ChoiceText]:
        choices = {run.choice.index: ChoiceText(run.choice.index) for run in runs}
        async with aclosing(merged(runs)) as pieces:
            async for piece in pieces:
                choices[piece.index].add(piece)
        return [choices[index] for index in sorted(choices)]

    async def _stream(self, request: Request, runs: Sequence[ChoiceRun], n: int, heads: list[bytes],
                      chunks: ChatChunks | CompletionChunks, continuous_usage: bool) -> Response:
        pieces = merged(runs)
        try:  # the first piece before the status line: a refusal still gets its 4xx
            first: Piece = await until_disconnected(request, anext(pieces))
        except BaseException:
            await pieces.aclose()
            raise

        async def body() -> AsyncIterator[bytes]:
            async with aclosing(pieces):
                try:
                    for head in heads:
                        yield head
                    piece: Piece | None = first
                    while piece is not None:
                        if (chunk := chunks.piece(piece, usage(runs, n) if continuous_usage else None)) is not None:
                            yield chunk
                        piece = await anext(pieces, None)
                    if chunks.include_usage:
                        yield chunks.usage(usage(runs, n))
                    yield DONE
                except OpenAIError as failed:  # after the status line: OpenAI's error event
                    yield event(failed.body())

        return StreamingResponse(body(), media_type="text/event-stream",
                                 headers={**self._headers, "Cache-Control": "no-cache"})

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        channel = self.channel = self._connect(self._triton_url)  # on the server's event loop
        try:
            yield
        finally:
            await channel.close()
            self.prompt_counter.close()


async def _openai_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, OpenAIError)
    return error.response()


async def _http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    return OpenAIError(error.status_code, f"{request.method} {request.url.path}: {error.detail}",
                       code="not_found" if error.status_code == 404 else None).response()


async def _client_gone(request: Request, error: Exception) -> Response:
    return Response(status_code=499)  # nobody reads it: the connection is closed


async def _internal(request: Request, error: Exception) -> Response:
    log.error("internal error on %s", request.url.path, exc_info=error)
    return OpenAIError(500, f"internal error: {type(error).__name__}", type="server_error").response()


def create_app(served: ServedPair, triton_url: str, api_key: str | None = None,
               connect: Callable[[str], TritonChannel] = TritonChannel) -> Starlette:
    """``connect``: the channel to the fronts from Triton's address (a fake one in tests)."""
    routes = OpenAIRoutes(served, triton_url, api_key, connect)
    return Starlette(
        routes=[Route("/health", routes.health), Route("/v1/models", routes.models),
                Route("/v1/models/{model:path}", routes.model),
                Route("/v1/chat/completions", routes.chat, methods=["POST"]),
                Route("/v1/completions", routes.completions, methods=["POST"])],
        exception_handlers={OpenAIError: _openai_error, HTTPException: _http_error, ClientGone: _client_gone,
                            ClientDisconnect: _client_gone, Exception: _internal},
        lifespan=routes.lifespan)
