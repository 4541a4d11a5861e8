"""A client of the OpenAI-compatible server that goes away ends its request on every model.

As tests/reliability/test_cancellation.py does for Triton's own clients: requests that cannot end on
their own for many seconds (max_tokens = min_tokens = LONG, vLLM's min_tokens extension), dropped
after their first token (a streamed reply) or while waiting (a whole reply); within 5 s every
one is counted `cancelled` by the entry and both models hold nothing. A request that ran to its end
would be counted `length`, so a cancellation that does not reach the fronts cannot pass.
"""

from __future__ import annotations

import json
import socket
import time

from helpers.servers import OPENAI_KEY
from helpers.routing import metrics

from helpers.cancellation import LONG, assert_cancelled_and_idle, wait_until_held

STREAMS = 6


def _send(openai_api, body: dict) -> socket.socket:
    """A raw HTTP/1.1 request, so that the test closes the connection exactly when it means to."""
    payload = json.dumps(body).encode()
    sock = socket.create_connection((openai_api.host, openai_api.port), timeout=120)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Authorization: Bearer {OPENAI_KEY}\r\n".encode()
                 + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    return sock


def _long(i: int, stream: bool) -> dict:
    return {"model": "tokenrouter", "prompt": f"def f{i}(x):", "max_tokens": LONG, "min_tokens": LONG, "seed": i,
            "stream": stream}


def test_dropped_streams_end_on_every_model(routing_server, openai_api) -> None:
    socks = [_send(openai_api, _long(i, stream=True)) for i in range(STREAMS)]
    for sock in socks:  # the status line, the headers and the first token's event
        received = b""
        while b"\"text\"" not in received:
            received += sock.recv(65536)
        assert received.startswith(b"HTTP/1.1 200")
    wait_until_held(routing_server, STREAMS)
    before = metrics(routing_server)
    since = time.monotonic()
    for sock in socks:
        sock.close()
    assert_cancelled_and_idle(routing_server, before, STREAMS, since)
    print(f"{STREAMS} dropped streams cancelled on every model within {time.monotonic() - since:.2f} s")


def test_dropped_whole_requests_end_on_every_model(routing_server, openai_api) -> None:
    """A client waiting for a whole (non-streamed) reply that hangs up: the server notices the
    disconnect while the fronts are still generating, and ends them."""
    socks = [_send(openai_api, _long(i, stream=False)) for i in range(2)]
    wait_until_held(routing_server, 2)
    before = metrics(routing_server)
    since = time.monotonic()
    for sock in socks:
        sock.close()
    assert_cancelled_and_idle(routing_server, before, 2, since)
