"""Locust load test of the served `tokenrouter` ensemble over gRPC streaming.

Each simulated user streams one completion at a time and reports three request types to Locust:
``ttft`` (time to the first token), ``inter_token`` (each gap between chunks) and ``completion``
(the whole request, with the number of output tokens as its size). A stream that errors, ends
without a finish reason, or returns no token counts as a failure.

Headless, bounded (what docs/benchmarks.md runs against `tokenrouter serve --tiny`):

    locust -f tools/locustfile.py --headless -u 8 -r 8 -t 2m --host localhost:8001 \
        --csv results/locust --only-summary

Options: TOKENROUTER_MAX_TOKENS (default 48) and TOKENROUTER_MODEL (default tokenrouter).
"""

from __future__ import annotations

import os
import queue
import random
import time

import grpc.experimental.gevent as grpc_gevent

grpc_gevent.init_gevent()  # before any channel exists: gRPC must cooperate with gevent's loop

import numpy as np  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402
from locust import User, between, task  # noqa: E402

MODEL = os.environ.get("TOKENROUTER_MODEL", "tokenrouter")
MAX_TOKENS = int(os.environ.get("TOKENROUTER_MAX_TOKENS", "48"))
PROMPTS = [
    "def fibonacci(n):",
    "Write a Python function that checks whether a string is a palindrome.",
    "class LRUCache:\n    def __init__(self, capacity):",
    "import json\n\ndef load_config(path):",
    "# Merge two sorted lists into one sorted list\n",
    "def parse_csv_line(line, sep=','):",
]


def _tensor(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


class StreamingUser(User):
    wait_time = between(0.0, 0.2)

    def on_start(self) -> None:
        self.client = grpcclient.InferenceServerClient(self.host)
        self.responses: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.responses.put((time.perf_counter(), result, error)))
        self.rng = random.Random(id(self))

    def on_stop(self) -> None:
        self.client.stop_stream()
        self.client.close()

    @task
    def stream_completion(self) -> None:
        prompt = self.rng.choice(PROMPTS)
        inputs = [
            _tensor("text_input", np.array([[prompt.encode()]], dtype=object), "BYTES"),
            _tensor("max_tokens", np.array([[MAX_TOKENS]], dtype=np.int32), "INT32"),
            _tensor("stream", np.array([[True]]), "BOOL"),
            _tensor("random_seed", np.array([[self.rng.randrange(2**32)]], dtype=np.uint64), "UINT64"),
        ]
        start = time.perf_counter()
        self.client.async_stream_infer(MODEL, inputs, enable_empty_final_response=True)
        last, tokens, finish, error = start, 0, "", None
        while True:
            try:
                at, result, failure = self.responses.get(timeout=120)
            except queue.Empty:
                error = TimeoutError("no response within 120 s")
                break
            if failure is not None:
                error = failure
                break
            response = result.get_response()
            if response.outputs:
                chunk = int(result.as_numpy("output_ids").size)
                if chunk:
                    self._fire("ttft" if tokens == 0 else "inter_token", at - (start if tokens == 0 else last))
                    tokens += chunk
                    last = at
                finish = result.as_numpy("finish_reason").reshape(-1)[0].decode() or finish
            if response.parameters["triton_final_response"].bool_param:
                break
        if error is None and (tokens == 0 or not finish):
            error = RuntimeError(f"stream ended with {tokens} tokens and finish reason '{finish}'")
        self._fire("completion", time.perf_counter() - start, size=tokens, error=error)

    def _fire(self, name: str, seconds: float, size: int = 0, error: BaseException | None = None) -> None:
        self.environment.events.request.fire(request_type="grpc-stream", name=name, response_time=seconds * 1000,
                                             response_length=size, exception=error, context={})
