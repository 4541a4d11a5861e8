"""Locust load test of a served TokenRouter front over gRPC streaming (tokenrouter.client).

Each simulated user streams one completion at a time and reports three request types to Locust:
``ttft`` (time to the first token), ``inter_token`` (each gap between chunks) and ``completion``
(the whole request, with the number of output tokens as its size). A stream that errors, ends
without a finish reason, or returns no token counts as a failure.

Headless, bounded (what docs/benchmarks.md runs against `tokenrouter serve --tiny`):

    locust -f tools/locustfile.py --headless -u 8 -r 8 -t 2m --host localhost:8001 \
        --csv results/locust --only-summary

Options: TOKENROUTER_MAX_TOKENS (default 48) and TOKENROUTER_MODEL (default tokenrouter; any front
name works, e.g. ensemble).
"""

from __future__ import annotations

import os
import queue
import random
import time

import grpc.experimental.gevent as grpc_gevent

grpc_gevent.init_gevent()  # before any channel exists: gRPC must cooperate with gevent's loop

from locust import User, between, task  # noqa: E402

from tokenrouter import client  # noqa: E402

MODEL = os.environ.get("TOKENROUTER_MODEL", client.DEFAULT_MODEL)
MAX_TOKENS = int(os.environ.get("TOKENROUTER_MAX_TOKENS", "48"))
PROMPTS = [
    "def fibonacci(n):",
    "Write a Python function that checks whether a string is a palindrome.",
    "class LRUCache:\n    def __init__(self, capacity):",
    "import json\n\ndef load_config(path):",
    "# Merge two sorted lists into one sorted list\n",
    "def parse_csv_line(line, sep=','):",
]
RESPONSE_TIMEOUT_S = 120.0


class StreamingUser(User):
    wait_time = between(0.0, 0.2)

    def on_start(self) -> None:
        self.stream = client.GrpcStream(self.host, clock=time.perf_counter)
        self.rng = random.Random(id(self))

    def on_stop(self) -> None:
        self.stream.close()

    @task
    def stream_completion(self) -> None:
        arrays = client.inputs(text_input=self.rng.choice(PROMPTS), max_tokens=MAX_TOKENS, stream=True,
                               seed=self.rng.randrange(2**32))
        start = time.perf_counter()
        self.stream.send(arrays, MODEL)
        last, tokens, finish = start, 0, ""
        error: Exception | None = None
        try:
            for reply in self.stream.replies(RESPONSE_TIMEOUT_S):
                if not reply.outputs:
                    continue
                if reply.ids:
                    self._fire("ttft" if tokens == 0 else "inter_token", reply.at - (start if tokens == 0 else last))
                    tokens += len(reply.ids)
                    last = reply.at
                finish = reply.finish_reason or finish
        except queue.Empty:
            error = TimeoutError(f"no response within {RESPONSE_TIMEOUT_S:g} s")
        except Exception as exc:  # noqa: BLE001 - the server's error, reported as this request's failure
            error = exc
        if error is None and (tokens == 0 or not finish):
            error = RuntimeError(f"stream ended with {tokens} tokens and finish reason '{finish}'")
        self._fire("completion", time.perf_counter() - start, size=tokens, error=error)

    def _fire(self, name: str, seconds: float, size: int = 0, error: BaseException | None = None) -> None:
        self.environment.events.request.fire(request_type="grpc-stream", name=name, response_time=seconds * 1000,
                                             response_length=size, exception=error, context={})
