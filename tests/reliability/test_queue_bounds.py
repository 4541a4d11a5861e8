"""Admission over a real Triton server: a full queue answers "server busy" at once while the
admitted requests finish, a request that waits past queue_timeout_s ends with an error, and the
metrics port shows both (the issue's probe: 128 streams at max_active 8 all queued, no bound).
"""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path

import pytest
from tritonclient.utils import InferenceServerException

from helpers.routing import metrics, routing_config
from tokenrouter.client import DEFAULT_MODEL, grpc_stream, http_post, inputs
from tokenrouter.serving.repository import render_repository

MAX_ACTIVE, MAX_QUEUE, QUEUE_TIMEOUT_S = 2, 2, 3.0
LONG = 1500  # tokens per admitted request: they must still run when the queued ones time out (~3.5 s in)
NEVER = 4095  # end id the tiny pair does not produce for these prompts: requests end by length
BUSY = f"server busy: {MAX_QUEUE} requests queued (max_queue {MAX_QUEUE})"


@pytest.fixture(scope="module")
def server(start_server, tiny_pair: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):  # noqa: F811
    config = routing_config(tiny_pair)
    config["scheduling"].update(max_active=MAX_ACTIVE, max_queue=MAX_QUEUE, queue_timeout_s=QUEUE_TIMEOUT_S)
    config["max_model_len"] = 4096
    for spec in config["models"].values():
        spec["kv_cache_tokens"] = 8192  # both long requests fit: only max_active holds the rest back
    return start_server(render_repository(config, tmp_path_factory.mktemp("queue-repo")))


def wait_for(server, key: str, value: float, timeout_s: float = 30.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        samples = metrics(server)
        if samples.get(key) == value:
            return samples
        time.sleep(0.1)
    raise AssertionError(f"{key} did not reach {value}: {samples.get(key)}")


def stream(server, seed: int, max_tokens: int) -> list[dict]:
    return grpc_stream(server.grpc_url, inputs(text_input="def add(a, b):", stream=True, max_tokens=max_tokens,
                                                    random_seed=seed, end_id=NEVER), timeout_s=300)


def test_a_full_queue_answers_busy_at_once_while_admitted_requests_finish(server) -> None:
    """Two long requests run (max_active 2), two more wait (max_queue 2): the next one over gRPC
    and over HTTP is refused at once with 'server busy'; the two running ones finish
    with all their tokens; the two waiting ones end after queue_timeout_s with a clear error; the
    metrics count 2 refusals and 2 timeouts and show the depth. Catches an unbounded queue, a
    refusal that waits for a slot, a timeout that never fires or also ends running requests."""
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        running = [pool.submit(stream, server, seed, LONG) for seed in range(MAX_ACTIVE)]
        wait_for(server, 'tokenrouter_active_requests{model="slm"}', MAX_ACTIVE)
        queued = [pool.submit(stream, server, 10 + seed, 4) for seed in range(MAX_QUEUE)]
        wait_for(server, 'tokenrouter_queue_depth{model="slm"}', MAX_QUEUE)
        queued_at = time.monotonic()

        start = time.monotonic()
        with pytest.raises(InferenceServerException, match=BUSY.replace("(", r"\(").replace(")", r"\)")):
            grpc_stream(server.grpc_url, inputs(text_input="x = 1", max_tokens=4), timeout_s=30)
        grpc_refusal_s = time.monotonic() - start
        start = time.monotonic()
        status, body = http_post(server.http_url, f"/v2/models/{DEFAULT_MODEL}/generate",
                                 {"text_input": "x = 1", "max_tokens": 4})
        http_refusal_s = time.monotonic() - start
        # The intake answers UNAVAILABLE; Triton 2.51's generate endpoint turns every model error
        # into a 400 (and a gRPC stream error carries no code), so the message is what tells.
        assert status in (400, 503) and BUSY in body, (status, body)
        assert grpc_refusal_s < 1.0 and http_refusal_s < 1.0, (grpc_refusal_s, http_refusal_s)

        for future in queued:
            with pytest.raises(InferenceServerException, match="not admitted within queue_timeout_s"):
                future.result(timeout=60)
        waited = time.monotonic() - queued_at
        assert not any(f.done() for f in running), "the long requests ended before the queue timed out"
        for future in running:
            responses = future.result(timeout=300)
            assert responses[-1]["finish_reason"].reshape(-1)[0] == b"length"
            assert sum(r["output_ids"].size for r in responses) == LONG
    assert QUEUE_TIMEOUT_S - 1.0 < waited < QUEUE_TIMEOUT_S + 5.0, waited

    after = wait_for(server, 'tokenrouter_active_requests{model="slm"}', 0)
    assert after['tokenrouter_refused_busy_total{model="slm"}'] == 2
    assert after['tokenrouter_queue_timeouts_total{model="slm"}'] == MAX_QUEUE
    assert after['tokenrouter_queue_depth{model="slm"}'] == 0
    assert after['tokenrouter_queue_wait_seconds_count{model="slm"}'] == MAX_ACTIVE  # admitted ones only
    assert sum(r["output_ids"].size for r in stream(server, 7, 8)) == 8  # and it serves on
