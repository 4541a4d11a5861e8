"""No single request delays another: every door is bounded before work.

The probes that once stalled the whole server, sent as a hostile client sends them, over gRPC
(Triton 2.51's HTTP frontend dies on bodies of 4 MB or more before any model sees them:
docs/reliability.md): 4M logit-bias ids (32 MB) and 10^6 stop ids straight to the entry subserver
(24.6 s and 4.3 s of its loop, then; now refused by their parameters, unread: the subservers are
internal), 10^6 end ids to a front (3.3 s) and to ``tensorrt_llm``, 10^6 stop ids to ``tensorrt_llm``,
4M ids to ``postprocessing`` (6.2 s to refuse). Each is refused with an error that names what is too
large, and a bystander's 8-token request through a front, sent again and again meanwhile, never
takes more than 0.5 s longer than it does alone.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Callable

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from e2e.test_routing_server import PROMPTS
from tokenrouter.client import grpc_inputs, grpc_stream, inputs

SLACK_S = 0.5
MILLION, FOUR_MILLION = 10**6, 4 * 10**6


def _bystander(server) -> float:
    """One 8-token request through the front, start to last response (seconds)."""
    start = time.monotonic()
    replies = grpc_stream(server.grpc_url, inputs(text_input=PROMPTS[0], max_tokens=8, min_tokens=8, stream=True))
    assert sum(len(r.ids) for r in replies) == 8
    return time.monotonic() - start


def _core(ids_per_row: int = 4, **arrays: np.ndarray) -> dict[str, np.ndarray]:
    return {"input_ids": np.full((1, ids_per_row), 5, np.int32), "input_lengths": np.array([[ids_per_row]], np.int32),
            "request_output_len": np.array([[4]], np.int32), **arrays}


def _stream_error(server, model: str, arrays: dict[str, np.ndarray]) -> str:
    with pytest.raises(InferenceServerException) as refused:
        grpc_stream(server.grpc_url, arrays, model, timeout_s=120)
    return str(refused.value)


def _infer_error(server, model: str, arrays: dict[str, np.ndarray]) -> str:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        with pytest.raises(InferenceServerException) as refused:
            client.infer(model, grpc_inputs(arrays), client_timeout=120)
    return str(refused.value)


PROBES: dict[str, tuple[Callable[..., str], str]] = {
    "4M logit-bias ids to slm": (lambda s: _stream_error(s, "slm", inputs(
        input_ids=[5, 6, 7], max_tokens=4, logit_bias_ids=np.zeros(FOUR_MILLION, np.int32),
        logit_bias_weights=np.zeros(FOUR_MILLION, np.float32))), "'slm' is internal to this server"),
    "10^6 stop ids to slm": (lambda s: _stream_error(s, "slm", inputs(
        input_ids=[5, 6, 7], max_tokens=4, stop_ids=np.full(MILLION, 5, np.int32))), "'slm' is internal"),
    "10^6 end ids to a front": (lambda s: _stream_error(s, "tokenrouter", inputs(
        text_input=PROMPTS[1], max_tokens=4, end_id=np.ones(MILLION, np.int32))),
        f"end_id holds {MILLION} ids; the limit is 1024"),
    "10^6 end ids to tensorrt_llm": (lambda s: _stream_error(s, "tensorrt_llm", _core(
        end_id=np.ones((1, MILLION), np.int32))), "end_id"),
    "10^6 stop ids to tensorrt_llm": (lambda s: _stream_error(s, "tensorrt_llm", _core(
        stop_words_list=np.ones((1, 2, MILLION), np.int32))), f"stop_words_list holds {MILLION} ids a row"),
    "4M ids to postprocessing": (lambda s: _infer_error(s, "postprocessing", {
        "TOKENS_BATCH": np.ones((1, 1, FOUR_MILLION), np.int32), "SEQUENCE_LENGTH": np.array([[5]], np.int32)}),
        "TOKENS_BATCH must be [rows, beams, n] with n <= 512"),
}


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_a_huge_request_is_refused_without_delaying_a_bystander(routing_server, probe):
    send, message = PROBES[probe]
    alone = statistics.median(_bystander(routing_server) for _ in range(5))
    answer: dict[str, object] = {}

    def hostile() -> None:
        start = time.monotonic()
        try:
            answer["error"] = send(routing_server)
        except BaseException as exc:  # noqa: BLE001 - a probe that is answered is a failure, reported below
            answer["error"] = exc
        answer["took"] = time.monotonic() - start

    thread = threading.Thread(target=hostile)
    thread.start()
    beside = []
    while thread.is_alive() or len(beside) < 3:
        beside.append(_bystander(routing_server))
    thread.join()
    print(f"{probe}: refused in {answer['took']:.2f} s; bystander alone {alone * 1000:.0f} ms, beside it "
          f"max {max(beside) * 1000:.0f} ms ({len(beside)} requests)")
    assert isinstance(answer["error"], str) and message in answer["error"], answer["error"]
    assert max(beside) <= alone + SLACK_S, (beside, alone)
