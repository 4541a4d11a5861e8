"""One hostile request, sent from a process of its own: ``python hostile_probe.py NAME GRPC_URL`` prints
"ready" once its imports are done, then ``{"error": ..., "took": seconds}`` (error: the server's refusal,
or what went wrong instead).

A process of its own, as a hostile client is: building and sending 32 MB in the test's own process
would hold its interpreter (and the bystander's client beside it) for a while, which is not the
server's doing (test_bounded_doors.py).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Callable

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tokenrouter.client import grpc_inputs, grpc_stream, inputs

MILLION, FOUR_MILLION = 10**6, 4 * 10**6


def _core(**arrays: np.ndarray) -> dict[str, np.ndarray]:
    return {"input_ids": np.full((1, 4), 5, np.int32), "input_lengths": np.array([[4]], np.int32),
            "request_output_len": np.array([[4]], np.int32), **arrays}


def _unary(url: str, model: str, arrays: dict[str, np.ndarray]) -> None:
    with grpcclient.InferenceServerClient(url) as client:
        client.infer(model, grpc_inputs(arrays), client_timeout=120)


# name -> (send it to the server at a gRPC url, what the refusal must say)
PROBES: dict[str, tuple[Callable[[str], object], str]] = {
    "4M logit-bias ids to slm": (lambda url: grpc_stream(url, inputs(
        input_ids=[5, 6, 7], max_tokens=4, logit_bias_ids=np.zeros(FOUR_MILLION, np.int32),
        logit_bias_weights=np.zeros(FOUR_MILLION, np.float32)), "slm", timeout_s=120),
        "'slm' is internal to this server"),
    "10^6 stop ids to slm": (lambda url: grpc_stream(url, inputs(
        input_ids=[5, 6, 7], max_tokens=4, stop_ids=np.full(MILLION, 5, np.int32)), "slm", timeout_s=120),
        "'slm' is internal to this server"),
    "10^6 end ids to a front": (lambda url: grpc_stream(url, inputs(
        text_input="def add(a, b):", max_tokens=4, end_id=np.ones(MILLION, np.int32)), "tokenrouter", timeout_s=120),
        f"end_id holds {MILLION} ids; the limit is 1024"),
    "10^6 end ids to tensorrt_llm": (lambda url: grpc_stream(url, _core(
        end_id=np.ones((1, MILLION), np.int32)), "tensorrt_llm", timeout_s=120), "end_id"),
    "10^6 stop ids to tensorrt_llm": (lambda url: grpc_stream(url, _core(
        stop_words_list=np.ones((1, 2, MILLION), np.int32)), "tensorrt_llm", timeout_s=120),
        f"stop_words_list holds {MILLION} ids a row"),
    "4M ids to postprocessing": (lambda url: _unary(url, "postprocessing", {
        "TOKENS_BATCH": np.ones((1, 1, FOUR_MILLION), np.int32), "SEQUENCE_LENGTH": np.array([[5]], np.int32)}),
        "TOKENS_BATCH must be [rows, beams, n] with n <= 512"),
}


def main(name: str, url: str) -> None:
    print("ready", flush=True)  # imports done: what follows is the probe alone
    start = time.monotonic()
    try:
        PROBES[name][0](url)
        error = "answered: the server did not refuse it"
    except InferenceServerException as exc:
        error = str(exc)
    print(json.dumps({"error": error, "took": time.monotonic() - start}))


if __name__ == "__main__":
    main(*sys.argv[1:])
