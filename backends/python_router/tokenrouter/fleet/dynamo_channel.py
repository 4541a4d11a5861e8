"""A peer session's channel over NVIDIA Dynamo's worker-to-worker calls, and its receiving end.

The session protocol (sending_session.py: numbered batches, answered, sent again after a new stream,
heartbeat, give-up) needs a channel that delivers call ``number`` and reports the answer. Here each
call is one ``client.direct(call, instance_id)`` to the peer worker's peer endpoint, carrying
``{"number", "payload" (the JSON batch as text), "parameters", "origin" (the sending worker's instance
id: an entry keeps one receiving session per instance of a pool)}``; the peer answers once with
``{"number"}`` or ``{"number", "error"}``. Calls go out as they come, each its own Dynamo request (so
they may arrive out of order); peer_sessions.py at the receiving end applies each once, in order.

A call that does not reach the instance (it is gone, or not registered) breaks the stream: the session
opens a new one (to whatever instance is registered then) and sends again what is unanswered, or gives
the peer up after ``transport.down_after_s``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..protocol import PeerMessage, decode_batch
from ..serving.subserver.peer_sessions import LinkRefused, PeerSessions
from ..serving.subserver.sending_session import Channel, OpenChannel

log = logging.getLogger(__name__)

OnAnswer = Callable[[int | None, str | None], None]


class DynamoChannel:
    """One stream of a session to one instance of the peer's endpoint. ``send`` may be called from
    any thread (the link's); the calls run on ``loop``, Dynamo's event loop in this process."""

    def __init__(self, client: Any, instance_id: int, loop: asyncio.AbstractEventLoop, on_answer: OnAnswer,
                 on_broken: Callable[[str], None], origin: int) -> None:
        self._client, self.instance_id, self._loop, self._origin = client, instance_id, loop, origin
        self._on_answer, self._on_broken = on_answer, on_broken
        self._closed = False

    def send(self, number: int, payload: bytes, parameters: dict[str, str]) -> None:
        if self._closed:
            return
        call = {"number": number, "payload": payload.decode(), "parameters": parameters, "origin": self._origin}
        asyncio.run_coroutine_threadsafe(self._call(call), self._loop)

    def close(self) -> None:
        self._closed = True

    async def _call(self, call: dict[str, Any]) -> None:
        try:
            stream = await self._client.direct(call, self.instance_id)
            async for response in stream:
                answer = response.data()
                if not self._closed:
                    number = answer.get("number")
                    self._on_answer(number if isinstance(number, int) else None, answer.get("error"))
                return
            reason = "the peer ended a call without an answer"
        except Exception as exc:  # noqa: BLE001 - whatever ends a call ends the stream; the session decides
            reason = f"{type(exc).__name__}: {exc}"
        if not self._closed:
            self._closed = True  # one report per stream: the session reopens once
            self._on_broken(reason)


def direct_opener(client: Any, loop: asyncio.AbstractEventLoop, instance: Callable[[], int | None],
                  origin: int) -> OpenChannel:
    """Opens DynamoChannels to ``instance()`` (the peer's instance id now; None: none registered), from
    this worker's instance ``origin``."""

    def open_channel(on_answer: OnAnswer, on_broken: Callable[[str], None]) -> Channel:
        target = instance()
        if target is None:
            raise ConnectionError("no instance of the peer is registered")
        return DynamoChannel(client, target, loop, on_answer, on_broken, origin)

    return open_channel


SessionsFor = Callable[[Any], PeerSessions]  # the receiving sessions of a call's origin


class OriginSessions:
    """The receiving end of a worker that hears several instances of one model (a pool): one
    ``PeerSessions`` per sending instance, made by ``make(origin)`` on its first call, so each
    instance's session (its numbering, its replacement) is its own."""

    def __init__(self, make: Callable[[int], PeerSessions]) -> None:
        self._make = make
        self._by_origin: dict[int, PeerSessions] = {}

    def __call__(self, origin: Any) -> PeerSessions:
        if not isinstance(origin, int) or isinstance(origin, bool):
            raise LinkRefused("a link call here must carry its 'origin' (the sending instance's id)")
        if origin not in self._by_origin:
            self._by_origin[origin] = self._make(origin)
        return self._by_origin[origin]


Deliver = Callable[[PeerMessage, Any], None]  # a message applied, with the instance that sent it (origin)


def answer_call(sessions: SessionsFor, deliver: Deliver, call: Any) -> dict[str, Any]:
    """The receiving end of one call: its messages applied (once, in order; ``deliver(message, origin)``)
    and the answer to send back."""
    number = call.get("number") if isinstance(call, dict) else None
    try:
        if not isinstance(call, dict) or not isinstance(call.get("parameters"), dict) \
                or not isinstance(call.get("payload"), str):
            raise LinkRefused("a link call must be an object with 'number', 'payload' (text) and 'parameters'")
        origin = call.get("origin")
        for message in sessions(origin).take(call["parameters"], lambda: decode_batch(call["payload"])):
            deliver(message, origin)
    except (LinkRefused, ValueError, TypeError, KeyError) as exc:  # a bad payload costs this call only
        log.warning("a link call refused: %s", exc)
        return {"number": number, "error": str(exc) or type(exc).__name__}
    return {"number": number}


def peer_handler(sessions: SessionsFor, deliver: Deliver) -> Callable[..., AsyncIterator[dict[str, Any]]]:
    """The handler of a worker's peer endpoint (``endpoint.serve_endpoint``)."""

    async def handle(call: Any, context: Any = None) -> AsyncIterator[dict[str, Any]]:
        del context
        yield answer_call(sessions, deliver, call)

    return handle
