"""The tiny pair served by Triton with both subservers on the vLLM engine (in-process in each stub,
the production path), the large model at tensor-parallel size 2 (two vLLM worker processes under
its stub, one core each): served output equals the embedded runtime on one-rank vLLM engines for
the same prompts, policy and seeds, concurrent streams route between the models, and both vLLM KV
pools are empty afterwards."""

from __future__ import annotations

import concurrent.futures

import pytest

from tokenrouter import TokenRouter
from tokenrouter.config import load_config
from tokenrouter.procfs import child_pids, proc_stat
from tokenrouter.serving.repository import render_repository

from tokenrouter.client import http_generate
from helpers.routing import PROMPTS, routing_config, stream_ids, wait_for_idle_pools


@pytest.fixture(scope="module")
def config(tiny_pair) -> dict:
    config = routing_config(tiny_pair)
    for spec in config["models"].values():
        spec.update(engine="vllm", dtype="float32", block_size=32, threads=1)  # as the embedded engines
    config["models"]["llm"]["tensor_parallel_size"] = 2  # the embedded one has one rank: TP 2 = TP 1
    return config


@pytest.fixture(scope="module")
def server(start_server, config, tmp_path_factory):
    # Each stub imports vLLM and builds its engine (tens of seconds on a busy 2-core machine).
    return start_server(render_repository(config, tmp_path_factory.mktemp("vllm-repo")), timeout_s=1080)


@pytest.fixture(scope="module")
def embedded(config, vllm_tiny_engines):
    engines = {"slm": vllm_tiny_engines["small"], "llm": vllm_tiny_engines["large"]}
    with TokenRouter(load_config(config), engines=engines) as engine:
        yield engine


# The start counts (pytest-timeout's default covers fixtures): three vLLM engines and two TP ranks took
# 4 min 40 s at load 15 and more than 10 min at load 39 on the shared 2-core machine.
@pytest.mark.timeout(1200)
def test_served_vllm_equals_embedded_vllm(server, embedded):
    children = [proc_stat(pid) for pid in child_pids(server.stubs()["llm"])]
    ranks = [child for child in children if child is not None and child.comm.startswith("VLLM::Worker")]
    assert len(ranks) == 2, "the large model's stub does not run two tensor-parallel ranks"
    prompts = [PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)) for i in range(8)]
    expected = embedded.generate(prompts, max_tokens=24, seed=3)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        served = list(pool.map(lambda p: stream_ids(server, p, max_tokens=24, random_seed=3), prompts))
    for (ids, models, reason), want in zip(served, expected):
        assert (ids, models, reason) == (want.token_ids, want.models, want.finish_reason)
    assert any("llm" in models for _, models, _ in served) and any("slm" in models for _, models, _ in served)
    reply = http_generate(server.http_url, {"text_input": PROMPTS[0], "max_tokens": 24, "random_seed": 3})
    assert reply["output_ids"] == expected[0].token_ids
    assert wait_for_idle_pools(server) == {}, "a vLLM pool still holds blocks or requests"
