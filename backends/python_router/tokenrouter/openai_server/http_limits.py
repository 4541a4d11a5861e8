"""The OpenAI port's limits at the HTTP level, before a request reaches the app.

uvicorn's httptools protocol has none of these: it read a 64 MB header or URL in full (about 130 MB,
other clients stalled for seconds), never closed a connection that sent its head or body a byte at
a time (slowloris), and took every connection offered. ``GuardedProtocol`` is that protocol with:

- the request head (request line and headers) bounded, counted as the parser reads it: a URL over
  ``max_url_bytes`` is a 414, a head over ``max_head_bytes`` a 431;
- the head due within ``head_timeout_s`` of the connection (or of the request's first byte on a
  kept-alive one), the body within ``body_timeout_s`` of the head: else a 408 and the connection closed;
- at most ``max_connections`` connections: one past them gets a 503 (Retry-After) and is closed;
- an idle kept-alive connection closed after ``keep_alive_s`` (uvicorn's own keep-alive timer).

A refused client gets its answer before the close: the response is written, the write side shut,
and what the client still sends is read and dropped for ``LINGER_S`` (a close with unread input
would reset the connection, and the client could lose the answer).
"""

from __future__ import annotations

import asyncio
import functools
import json
from dataclasses import dataclass
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

LINGER_S = 1.0
REASONS = {408: "Request Timeout", 414: "URI Too Long", 431: "Request Header Fields Too Large",
           503: "Service Unavailable"}


@dataclass(frozen=True)
class HttpLimits:
    max_head_bytes: int = 32 * 1024  # request line and headers
    max_url_bytes: int = 8 * 1024
    head_timeout_s: float = 10.0
    body_timeout_s: float = 60.0  # an 8 MiB body (the real pair's cap) at about 1 Mbit/s
    keep_alive_s: float = 5.0
    max_connections: int = 1024


class _Refused(Exception):
    """Raised in a parser callback to stop parsing; uvicorn then calls send_400_response."""


def refusal(status: int, message: str) -> bytes:
    """A whole HTTP response with OpenAI's error body, closing the connection."""
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error" if status < 500 else
                                 "server_error", "param": None, "code": None}}).encode()
    retry = "retry-after: 1\r\n" if status == 503 else ""
    return (f"HTTP/1.1 {status} {REASONS[status]}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n{retry}connection: close\r\n\r\n").encode() + body


class GuardedProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, limits: HttpLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self._deadline: asyncio.TimerHandle | None = None
        self._head_bytes = self._url_bytes = 0  # as parsed
        self._fed = 0  # fed to the parser while the head was not whole
        self._heads_done = 0  # heads parsed on this connection
        self._in_head = True  # the parser has not seen this request's whole head yet
        self._refused: bytes | None = None  # the response for a request stopped mid-parse
        self._lingering = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._refuse(refusal(503, f"the server holds {self.limits.max_connections} connections, its limit; "
                                      "retry later"))
            return
        self._arm(self.limits.head_timeout_s, "the request head")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:  # refused: what still comes is dropped until the close
            return
        in_head, heads_done = self._in_head, self._heads_done
        super().data_received(data)
        # The parser keeps a URL or a header value to itself until it ends: count what it was fed instead,
        # a piece that began and ended inside one head (a head that ends is counted by on_url / on_header).
        if in_head and self._in_head and self._heads_done == heads_done and not self._lingering:
            self._fed += len(data)
            if self._fed > self.limits.max_head_bytes:  # no URL yet: the request line is what is too long
                self._refuse(self._head_too_large() if self._url_bytes else self._url_too_long())

    # parser callbacks
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = self._url_bytes = self._fed = 0
        self._in_head = True
        if self._deadline is None:  # a kept-alive connection's next request
            self._arm(self.limits.head_timeout_s, "the request head")

    def on_url(self, url: bytes) -> None:
        self._url_bytes += len(url)
        if self._url_bytes > self.limits.max_url_bytes:
            self._refused = self._url_too_long()
            raise _Refused()
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value))
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._heads_done += 1
        self._disarm()
        self._arm(self.limits.body_timeout_s, "the request body")
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        self._in_head, self._fed = True, 0  # what comes next is the next request's head
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        if self._refused is None:
            super().send_400_response(msg)
        else:
            self._refuse(self._refused)

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self.limits.max_head_bytes:
            self._refused = self._head_too_large()
            raise _Refused()

    def _url_too_long(self) -> bytes:
        return refusal(414, f"the URL is over the limit of {self.limits.max_url_bytes} bytes")

    def _head_too_large(self) -> bytes:
        return refusal(431, f"the request line and headers are over the limit of {self.limits.max_head_bytes} bytes")

    def _arm(self, seconds: float, what: str) -> None:
        self._deadline = self.loop.call_later(seconds, self._too_slow, seconds, what)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self, seconds: float, what: str) -> None:
        self._deadline = None
        # a response under way (the app answered a body early, e.g. 413; a kept-alive connection's
        # previous answer still streaming): no second status line can follow it, just close
        cycle = self.cycle
        if cycle is not None and cycle.response_started and (not self._in_head or not cycle.response_complete):
            self.transport.close()
            return
        self._refuse(refusal(408, f"{what} did not arrive within {seconds:g} s"))

    def _refuse(self, response: bytes) -> None:
        self._disarm()
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:  # the app is told, and writes no more
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self._lingering = True
        self.transport.write(response)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)


def server_config(app: Any, host: str, port: int, *, drain_timeout_s: float, log_level: str = "warning",
                  limits: HttpLimits = HttpLimits()) -> uvicorn.Config:
    """uvicorn's configuration of the OpenAI server: the guarded protocol, no WebSocket upgrades."""
    # uvicorn annotates the timeouts as int but hands them to asyncio's timers, which take seconds as
    # floats; and ``http`` takes any factory of protocols (the class is only its usual value).
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                          timeout_graceful_shutdown=drain_timeout_s,  # type: ignore[arg-type]
                          timeout_keep_alive=limits.keep_alive_s,  # type: ignore[arg-type]
                          http=functools.partial(GuardedProtocol, limits=limits),  # type: ignore[arg-type]
                          ws="none")
