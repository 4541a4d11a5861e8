"""The OpenAI port's HTTP limits, on a real uvicorn server (the app over a fake Triton channel, in a
thread of this process), probed over loopback sockets as a hostile client would: a 64 MB header and
a 64 MB URL refused as they arrive, slow heads, slow bodies and silent connections closed within the
documented time, and 2,000 connections refused past the limit without memory growth, while an
ordinary request is still answered.

The timeouts are shortened here (1 s instead of 10 s and 60 s) to keep the test short; the
defaults are the documented values.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import threading
import time
from typing import Iterator

import httpx
import pytest
import uvicorn

from tokenrouter.launch.free_ports import free_port
from tokenrouter.openai_server.app import create_app
from tokenrouter.openai_server.http_limits import HttpLimits, server_config

from .asgi_app import FakeChannel, served_pair

LIMITS = HttpLimits(head_timeout_s=1.0, body_timeout_s=1.0, keep_alive_s=1.0, max_connections=100)
MB = 1 << 20
CHAT = b'{"model": "tokenrouter", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}'


class Errors(logging.Handler):
    """uvicorn's error log (an exception in the app, a write after the close): none is expected."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(autouse=True)
def no_server_errors() -> Iterator[None]:
    errors = Errors()
    logging.getLogger("uvicorn.error").addHandler(errors)
    yield
    logging.getLogger("uvicorn.error").removeHandler(errors)
    assert not errors.records, [record.getMessage() for record in errors.records]


@pytest.fixture(scope="module")
def server(tiny_codec) -> Iterator[tuple[str, int]]:
    port = free_port()
    app = create_app(served_pair(tiny_codec), "fake:0", connect=FakeChannel)
    running = uvicorn.Server(server_config(app, "127.0.0.1", port, drain_timeout_s=1, limits=LIMITS))
    thread = threading.Thread(target=running.run, name="openai-http-limits", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not running.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running.started
    yield "127.0.0.1", port
    running.should_exit = True
    thread.join(timeout=10)


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    """The most this process held while the block ran, over what it held before (sampled every 10 ms)."""

    def __enter__(self) -> "PeakRss":
        gc.collect()
        self.before, self.peak, self._done = rss_bytes(), 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._done.wait(0.01):
            self.peak = max(self.peak, rss_bytes())

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def grown_mb(self) -> float:
        return (self.peak - self.before) / MB


def answered(server: tuple[str, int]) -> None:
    """An ordinary chat gets its 200 (the server serves beside the probe)."""
    reply = httpx.post(f"http://{server[0]}:{server[1]}/v1/chat/completions", content=CHAT, timeout=5)
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == "ok"


def read_all(sock: socket.socket, timeout_s: float) -> bytes:
    """What the server sends until it closes (or ``timeout_s`` passes)."""
    sock.settimeout(timeout_s)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return received


def flood(server: tuple[str, int], head: bytes, filler: bytes, total: int) -> tuple[bytes, int]:
    """``head`` then ``filler`` up to ``total`` bytes, until the server stops taking them; its answer
    and the bytes it took."""
    sock = socket.create_connection(server, timeout=10)
    sent = 0
    with sock:
        try:
            sock.sendall(head)
            chunk = filler * (MB // len(filler))
            while sent < total:
                sock.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        return read_all(sock, 5), sent


@pytest.mark.parametrize(("head", "filler", "status"), [
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Big: ", b"a", b"431"),
    (b"GET /v1/models?", b"q=1&", b"414"),
])
def test_64_mb_header_or_url_refused_as_it_arrives(server, head: bytes, filler: bytes, status: bytes) -> None:
    start = time.monotonic()
    with PeakRss() as memory:
        answer, _ = flood(server, head, filler, 64 * MB)
    elapsed, grown = time.monotonic() - start, memory.grown_mb
    print(f"{status.decode()} after {elapsed:.2f} s, server process grew {grown:.1f} MB")
    assert answer.startswith(b"HTTP/1.1 " + status) and b'"error"' in answer
    # never held whole (64 MB); what the server reads and drops while it lingers churns the allocator: 1-34 MB seen
    assert elapsed < 10 and grown < 48
    answered(server)


def test_bodies_past_the_head_limit_and_kept_alive_requests_are_not_heads(server) -> None:
    """A 200 KB body arrives in pieces far over the head limit, and the next request on the same
    connection begins right after it: neither is counted as a request head."""
    content = (b'{"model": "tokenrouter", "max_tokens": 3, "messages": [{"role": "user", "content": "'
               + b"a" * 100_000 + b'"}]}')
    with httpx.Client(base_url=f"http://{server[0]}:{server[1]}", timeout=10) as client:
        for _ in range(3):
            reply = client.post("/v1/chat/completions", content=content)
            assert reply.status_code == 200, reply.text
        deep = client.post("/v1/chat/completions", content=b"[" * 200_000)
        assert deep.status_code == 400 and "nested too deeply" in deep.json()["error"]["message"]


def test_slow_head_slow_body_and_silent_connections_are_closed_in_time(server) -> None:
    """A head sent a byte every 0.1 s, a body that stops half way, a connection that sends nothing:
    each gets a 408 and is closed within the limit (1 s here) and a second of slack; an ordinary
    chat meanwhile is answered."""
    slow_head = socket.create_connection(server)
    slow_body = socket.create_connection(server)
    silent = socket.create_connection(server)
    start = time.monotonic()
    slow_body.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + CHAT[:20])
    closed_at = {}
    for byte in b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"s" * 100:
        try:
            slow_head.send(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            break
        if time.monotonic() - start > 3:
            break
        time.sleep(0.1)
    answered(server)
    for name, sock in (("head", slow_head), ("body", slow_body), ("silent", silent)):
        with sock:
            answer = read_all(sock, 5)
            closed_at[name] = time.monotonic() - start
            assert answer.startswith(b"HTTP/1.1 408"), (name, answer)
    print({name: f"{at:.2f} s" for name, at in closed_at.items()})
    assert max(closed_at.values()) < LIMITS.head_timeout_s + 2.5


def test_a_kept_alive_connections_slow_next_head_gets_its_408(server) -> None:
    """After an answered request, the next one's head is due within the limit too: a 408, not a bare close."""
    with socket.create_connection(server) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        first = b""
        while not first.endswith(b"}]}"):  # the whole first answer: its head and its JSON body
            first += sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")  # and the rest never comes
        start = time.monotonic()
        answer = read_all(sock, 5)
        assert answer.startswith(b"HTTP/1.1 408") and time.monotonic() - start < LIMITS.head_timeout_s + 2


def test_2000_connections_refused_past_the_limit_without_growth(server) -> None:
    """2,000 connections at once, each sending nothing: those past the limit (100 here) get a 503 and
    are closed; the process does not grow with them; the ones within the limit are closed by the head
    timeout, and then a new client is served."""
    socks = []
    start = time.monotonic()
    with PeakRss() as memory:
        for _ in range(2000):
            socks.append(socket.create_connection(server, timeout=10))
        refused, waiting = 0, list(socks)
        deadline = time.monotonic() + 30  # passes over the sockets not answered yet: a loaded server is slow
        while waiting and refused < 2000 - LIMITS.max_connections and time.monotonic() < deadline:
            still = []
            for sock in waiting:
                sock.settimeout(0.01)  # the held ones say nothing: do not wait on each
                try:
                    refused += sock.recv(64).startswith(b"HTTP/1.1 503")
                except TimeoutError:
                    still.append(sock)
                except ConnectionResetError:
                    pass
            waiting = still
    grown, elapsed = memory.grown_mb, time.monotonic() - start
    for sock in socks:
        sock.close()
    print(f"{refused} of 2000 refused in {elapsed:.1f} s; the process grew {grown:.1f} MB")
    assert refused >= 2000 - LIMITS.max_connections and elapsed < 60 and grown < 32
    time.sleep(LIMITS.head_timeout_s + 0.5)
    answered(server)
