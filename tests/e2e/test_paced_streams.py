"""Streams at more tokens per second than one response per token can carry.

The shipped simulated A100 pair with its clock switched off (time_scale 0: steps as fast as the
CPU allows), so each stream produces tokens faster than its paced responses go out (32 streams
at scheduling.max_responses_per_s: one response per stream per 80 ms) and responses carry several
tokens. Every stream must still equal the embedded engine's output: every token, in order, with
its model, the finish reason and the UTF-8 text. Through a front under TensorRT-LLM's names
(frontend.one_token_per_response) the same streams carry one token per response, as TensorRT-LLM's
do: tools that count responses as tokens (perf_analyzer got 30 responses for 32 tokens) count right.
"""

from __future__ import annotations

import concurrent.futures

import pytest

from tokenrouter import TokenRouter
from tokenrouter.config import load_config
from tokenrouter.serving.repository import render_repository
from tokenrouter.text import TextCodec
from tokenrouter.launch.paths import shipped_config

from tokenrouter.client import grpc_stream, inputs

STREAMS, MAX_TOKENS = 32, 48


@pytest.fixture(scope="module")
def config():
    config = load_config(shipped_config("sim-a100.yaml"))
    config.frontend.names = ["tokenrouter", "ensemble"]  # ours (paced) and one of TensorRT-LLM's names
    for spec in config.models.values():
        spec.profile = {**spec.profile, "time_scale": 0.0}
    return config


@pytest.fixture(scope="module")
def server(config, start_server, tmp_path_factory):
    return start_server(render_repository(config, tmp_path_factory.mktemp("coalesce-repo")))


@pytest.fixture(scope="module")
def expected(config):
    with TokenRouter(config, codec=TextCodec.from_path(config.tokenizer_path)) as embedded:
        return embedded.generate(PROMPTS, max_tokens=MAX_TOKENS, seed=7)


PROMPTS = [f"def f{i}(x):\n    return x * {i}" for i in range(STREAMS)]


@pytest.mark.parametrize("front", ["tokenrouter", "ensemble"])
def test_streams_deliver_every_token_in_order_with_its_model(server, expected, front):
    with concurrent.futures.ThreadPoolExecutor(STREAMS) as pool:
        served = list(pool.map(lambda p: grpc_stream(server.grpc_url, inputs(
            text_input=p, max_tokens=MAX_TOKENS, random_seed=7, stream=True), front), PROMPTS))
    for responses, want in zip(served, expected):
        ids = [int(t) for r in responses for t in r["output_ids"].reshape(-1)]
        models = [m.decode() for r in responses for m in r["output_models"].reshape(-1)]
        assert (ids, models) == (want.token_ids, want.models)
        assert responses[-1]["finish_reason"].reshape(-1)[0].decode() == want.finish_reason
        assert "".join(r.text for r in responses) == want.text
        assert responses[-1]["large_model_share"].reshape(-1)[0] == pytest.approx(want.large_model_share)
    sizes = [r["output_ids"].size for responses in served for r in responses]
    assert any("llm" in want.models for want in expected)
    if front == "tokenrouter":
        assert max(sizes) > 1, "no response carried more than one token: nothing was paced"
    else:  # TensorRT-LLM's streaming: as many responses as tokens, also where the llm returned a run
        assert sizes == [1] * len(sizes) and len(sizes) == sum(len(want.token_ids) for want in expected), \
            f"{len(sizes)} responses for {sum(sizes)} tokens; sizes {sorted(set(sizes))}"
