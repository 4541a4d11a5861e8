"""The real thing end to end: a Triton server on loopback serving the tiny pair through the
fronts and the python_router subservers (BLS handoffs between two stub processes).

Served output must equal the embedded TokenRouter's for the same prompt, policy, seed and
sampling inputs, under every front name and in a batch; bad input fails only its own request; the
metrics port shows the routing. Cancellation: test_cancellation.py.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import re
import threading
import time

import pytest
from tritonclient.utils import InferenceServerException

from tokenrouter import TokenRouter
from tokenrouter.client import (DEFAULT_MODEL, batch, grpc_infer, grpc_stream, http_generate, http_generate_stream,
                                http_post, inputs)
from tokenrouter.serving.repository import render_repository

from helpers.routing import PROMPTS, metrics, metrics_text, routing_config, stream_ids, wait_for_idle_pools
from helpers.servers import UNARY


@pytest.fixture(scope="module")
def config(tiny_pair) -> dict:
    return routing_config(tiny_pair)


@pytest.fixture(scope="module")
def server(routing_server):
    """The suite's routing server (tests/conftest.py): ``config`` with a unary front beside it."""
    return routing_server


@pytest.fixture(scope="module")
def embedded(config):
    with TokenRouter.from_config(config) as engine:
        yield engine


@pytest.mark.parametrize("prompt", PROMPTS[:3])
def test_grpc_stream_and_http_generate_equal_the_embedded_engine(server, embedded, prompt):
    expected = embedded.generate(prompt, max_tokens=24, seed=5)[0]
    assert expected.token_ids and set(expected.models) <= {"slm", "llm"}

    ids, models, reason = stream_ids(server, prompt, max_tokens=24, random_seed=5)
    assert (ids, models, reason) == (expected.token_ids, expected.models, expected.finish_reason)

    reply = http_generate(server.http_url, {"text_input": prompt, "max_tokens": 24, "seed": 5,
                                            "exclude_input_in_output": True})
    assert reply["output_ids"] == expected.token_ids
    assert reply["output_models"] == expected.models
    assert reply["text_output"] == expected.text
    assert reply["large_model_share"] == pytest.approx(expected.large_model_share)
    echoed = http_generate(server.http_url, {"text_input": prompt, "max_tokens": 24, "seed": 5})
    assert echoed["text_output"] == embedded.codec.decode(embedded.codec.encode_prompt(prompt) + expected.token_ids)


@pytest.mark.parametrize("model", [DEFAULT_MODEL, UNARY])
def test_the_decoupled_and_the_unary_front_serve_the_same_output(server, embedded, model):
    """Both modes of the front (every name in frontend.names renders the same front: test_repository.py)."""
    expected = embedded.generate(PROMPTS[2], max_tokens=16, seed=8)[0]
    values = inputs(text_input=PROMPTS[2], max_tokens=16, seed=8, exclude_input_in_output=True)
    if model == UNARY:
        reply = grpc_infer(server.grpc_url, values, model)
    else:
        reply = grpc_stream(server.grpc_url, values, model)[0]
    assert (reply.ids, reply.models, reply.text) == (expected.token_ids, expected.models, expected.text)


def test_tensorrt_llm_sampling_inputs_reach_every_model(server, embedded):
    """Penalties, min_tokens, embedding bias (words) and log probabilities through the front and the
    entry's intake equal the embedded engine's with the same values. Catches an input the front or
    the intake drops (the intake read none of them before) and log probabilities lost on the way."""
    codec = embedded.codec
    bias_word = codec.decode(embedded.generate(PROMPTS[0], max_tokens=3, seed=9)[0].token_ids[1:2])
    bias = [(token, -4.0) for token in codec.token_sequences([bias_word])[0]]
    sampling = dict(repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.2, min_tokens=20)
    expected = embedded.generate(PROMPTS[0], max_tokens=20, temperature=0.9, top_k=40, seed=9, logit_bias=bias,
                                 return_log_probs=True, **sampling)[0]
    plain = embedded.generate(PROMPTS[0], max_tokens=20, temperature=0.9, top_k=40, seed=9)[0]
    assert expected.token_ids != plain.token_ids  # the inputs change the output, so dropping one shows
    replies = grpc_stream(server.grpc_url, inputs(
        text_input=PROMPTS[0], max_tokens=20, temperature=0.9, top_k=40, seed=9, stream=True, return_log_probs=True,
        embedding_bias_words=[bias_word], embedding_bias_weights=[-4.0], **sampling))
    assert [i for r in replies for i in r.ids] == expected.token_ids
    assert [m for r in replies for m in r.models] == expected.models
    logprobs = [float(p) for r in replies for p in r["output_log_probs"].reshape(-1)]
    assert logprobs == pytest.approx(expected.logprobs, abs=1e-4)
    assert replies[-1]["cum_log_probs"][0][0] == pytest.approx(sum(expected.logprobs), abs=1e-3)


def test_a_batch_is_one_generation_per_row(server, embedded):
    prompts = PROMPTS[:3]
    expected = embedded.generate(prompts, max_tokens=12, seed=4)
    replies = grpc_stream(server.grpc_url, batch(*(inputs(text_input=p, max_tokens=12, seed=4, stream=True)
                                                   for p in prompts)))
    for row, want in enumerate(expected):
        mine = [r for r in replies if r["batch_index"][0][0] == row]
        assert [i for r in mine for i in r.ids] == want.token_ids and "".join(r.text for r in mine) == want.text


def test_sampled_output_is_reproducible_and_matches_embedded(server, embedded):
    params = {"max_tokens": 20, "temperature": 0.8, "top_p": 0.9, "top_k": 50, "random_seed": 1234}
    expected = embedded.generate(PROMPTS[3], max_tokens=20, temperature=0.8, top_p=0.9, top_k=50, seed=1234)[0]
    ids, models, _ = stream_ids(server, PROMPTS[3], **params)
    assert ids == expected.token_ids and models == expected.models


SEEDED = dict(max_tokens=16, min_tokens=16, temperature=1.0, top_p=1.0)
SEED_PATHS = {  # every way a client sends a seed -> the tokens served for PROMPTS[1]
    "grpc stream, seed": lambda server, seed: stream_ids(server, PROMPTS[1], seed=seed, **SEEDED)[0],
    "grpc stream, random_seed": lambda server, seed: stream_ids(server, PROMPTS[1], random_seed=seed, **SEEDED)[0],
    "http generate, seed": lambda server, seed: http_generate(server.http_url, {
        "text_input": PROMPTS[1], "seed": seed, "exclude_input_in_output": True, **SEEDED})["output_ids"],
    "unary grpc infer, random_seed": lambda server, seed: grpc_infer(
        server.grpc_url, inputs(text_input=PROMPTS[1], random_seed=seed, exclude_input_in_output=True, **SEEDED),
        UNARY).ids,
    "second row of a batch, seed": lambda server, seed: [i for r in grpc_stream(server.grpc_url, batch(
        inputs(text_input=PROMPTS[0], seed=seed + 100, stream=True, **SEEDED),
        inputs(text_input=PROMPTS[1], seed=seed, stream=True, **SEEDED)))
        if r["batch_index"][0][0] == 1 for i in r.ids],
}


@pytest.mark.parametrize("path", list(SEED_PATHS))
def test_a_seed_reaches_the_sampler_on_every_path(server, embedded, path):
    """Sampled output (temperature 1, top_p 1) equals the embedded engine's for the same seed, for two seeds,
    on each way a client can send one, through the real subservers. Catches a front that drops a
    seed, reads the wrong name, or gives a row another row's seed (the echo double ignores seeds)."""
    want = {seed: embedded.generate(PROMPTS[1], seed=seed, **SEEDED)[0].token_ids for seed in (21, 22)}
    assert want[21] != want[22]  # the seed decides the output, so a lost one shows
    for seed, tokens in want.items():
        assert SEED_PATHS[path](server, seed) == tokens, seed


def tensorrt_llm_samples(sent: dict) -> bool:
    """Whether TensorRT-LLM samples (rather than decodes greedily) for these sampling inputs: a
    missing top_k or top_p reads as 0, a missing temperature as 1; top_k 0 with top_p 0 is greedy."""
    return sent.get("temperature", 1.0) > 0 and (sent.get("top_k", 0) > 0 or sent.get("top_p", 0.0) > 0)


SAMPLING_INPUTS = [{name: value for name, value in zip(("temperature", "top_k", "top_p"), values) if value is not None}
                   for values in itertools.product((None, 0.0, 0.7), (None, 0, 5), (None, 0.0, 0.9))]


@pytest.mark.parametrize("sent", SAMPLING_INPUTS,
                         ids=lambda sent: ",".join(f"{k}={v}" for k, v in sent.items()) or "none")
def test_greedy_or_sampled_as_tensorrt_llm_decides(server, embedded, sent):
    """Every combination of temperature / top_k / top_p sent or not: the embedded engine's greedy
    tokens where TensorRT-LLM is greedy, other tokens where it samples (same seed, so the same
    routing). Catches temperature alone turning sampling on (TensorRT-LLM's ensemble client always
    sends 1.0) and a missing top_p read as 1."""
    for seed in (31, 32):
        served = http_generate(server.http_url, {"text_input": PROMPTS[2], "max_tokens": 16, "min_tokens": 16,
                                                 "seed": seed, "exclude_input_in_output": True, **sent})["output_ids"]
        greedy = embedded.generate(PROMPTS[2], max_tokens=16, min_tokens=16, seed=seed)[0].token_ids
        assert (served != greedy) == tensorrt_llm_samples(sent), seed


def test_http_generate_stream_text_adds_up(server, embedded):
    expected = embedded.generate(PROMPTS[4], max_tokens=16, seed=2)[0]
    events = list(http_generate_stream(server.http_url, {"text_input": PROMPTS[4], "max_tokens": 16,
                                                         "random_seed": 2, "stream": True}))
    assert "".join(e["text_output"] for e in events) == expected.text
    assert events[-1]["finish_reason"] == expected.finish_reason


def test_sixteen_concurrent_streams_complete_with_attribution(server, embedded):
    prompts = [PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)) for i in range(16)]
    expected = embedded.generate(prompts, max_tokens=24, seed=3)
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        served = list(pool.map(lambda p: stream_ids(server, p, max_tokens=24, random_seed=3), prompts))
    for (ids, models, reason), want in zip(served, expected):
        assert ids == want.token_ids and models == want.models and reason == want.finish_reason
    assert any("llm" in models for _, models, _ in served)


def test_metrics_count_exactly_what_one_request_did(server):
    """Before/after differences of the counters, matched to this request's own output: tokens
    per model = its tokens attributed to that model; handoffs = its visits to the large model
    (random routing with run_length 1: each visit drops the small model's token and writes one
    large-model token, kept as it hands back, unless that token ends the request).
    Catches counters that move by the wrong amount, which "> 0" checks let through."""
    time.sleep(0.7)  # the previous test's last refresh
    before = metrics(server)
    started = time.monotonic()
    _, models, reason = stream_ids(server, PROMPTS[5], max_tokens=24, min_tokens=24, random_seed=9)
    took = time.monotonic() - started
    time.sleep(0.7)  # one metrics refresh
    after = metrics(server)

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    runs = models.count("llm")
    ends_on_llm = models[-1] == "llm"
    assert runs > 0, models
    assert delta('tokenrouter_tokens_total{model="slm"}') == models.count("slm")
    assert delta('tokenrouter_tokens_total{model="llm"}') == models.count("llm")
    assert delta('tokenrouter_handoffs_total{direction="out",model="slm"}') == runs
    assert delta('tokenrouter_handoffs_total{direction="in",model="llm"}') == runs
    assert delta('tokenrouter_handoffs_total{direction="out",model="llm"}') == runs - ends_on_llm
    assert delta('tokenrouter_handoffs_total{direction="in",model="slm"}') == runs - ends_on_llm
    assert 0 < after['tokenrouter_large_model_token_share{model="slm"}'] < 1
    steps = sum(v for k, v in after.items() if k.startswith("tokenrouter_batch_size_count"))
    assert steps - sum(v for k, v in before.items() if k.startswith("tokenrouter_batch_size_count")) >= len(models)
    assert reason == "length" and delta('tokenrouter_requests_total{model="slm",reason="length"}') == 1
    assert delta('tokenrouter_queue_wait_seconds_count{model="slm"}') == 1  # admitted once
    for model in ("slm", "llm"):  # both ran steps for it, within its time
        assert 0 < delta(f'tokenrouter_busy_seconds_total{{model="{model}"}}') < took, model
    # every handoff is one peer call at least (progress and ended messages add more)
    sends = sum(delta(f'tokenrouter_peer_send_seconds_count{{model="{model}"}}') for model in ("slm", "llm"))
    assert sends >= 2 * runs - ends_on_llm


# One refusal per place that refuses (the front's inputs, the tokenized prompt, the context, a sampling
# value) while a routed request runs. Each sampling field's refusals are unit tests' (runtime/test_api.py,
# with other requests going on) and the front's are test_frontend.py's, through a server.
BAD_INPUTS = [
    ({"text_input": ""}, "empty"),
    ({"max_tokens": 8}, "text_input"),
    ({"text_input": "word " * 2000}, "limit"),
    ({"text_input": "x", "max_tokens": 10**6}, "context"),
    ({"text_input": "x", "top_k": -3}, "top_k"),
]


@pytest.mark.parametrize("values,match", BAD_INPUTS, ids=[m for _, m in BAD_INPUTS])
def test_bad_input_fails_alone_while_a_good_request_completes(server, embedded, values, match):
    expected = embedded.generate(PROMPTS[1], max_tokens=32, seed=4)[0]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        good = pool.submit(stream_ids, server, PROMPTS[1], max_tokens=32, random_seed=4)
        with pytest.raises(InferenceServerException, match=match):
            grpc_stream(server.grpc_url, inputs(**{"max_tokens": 8, **values}))
        assert good.result(timeout=120)[0] == expected.token_ids


def test_two_prompts_in_one_row_are_refused(server):
    with pytest.raises(InferenceServerException, match="(?i)text_input.*shape|shape.*text_input"):
        grpc_stream(server.grpc_url, inputs(text_input=["a", "b"], max_tokens=4))


def test_unknown_policy_fails_the_load_with_a_clear_error(tiny_pair, tmp_path):
    from tokenrouter.config import ConfigError

    with pytest.raises(ConfigError, match="unknown policy 'no_such_policy'"):
        render_repository(routing_config(tiny_pair, "no_such_policy", {}), tmp_path / "repo")


def test_bad_words_like_tensorrt_llm_clients_send_them(server, embedded):
    # TensorRT-LLM's own curl example sends empty bad/stop words; that must just work
    plain = http_generate(server.http_url, {"text_input": PROMPTS[0], "max_tokens": 16, "bad_words": "",
                                            "stop_words": "", "random_seed": 6})
    assert plain["output_ids"] == embedded.generate(PROMPTS[0], max_tokens=16, seed=6)[0].token_ids
    word = embedded.codec.decode(plain["output_ids"][:1])
    expected = embedded.generate(PROMPTS[0], max_tokens=16, seed=6, bad_words=[word])[0]
    reply = http_generate(server.http_url, {"text_input": PROMPTS[0], "max_tokens": 16, "bad_words": [word],
                                            "random_seed": 6})
    assert reply["output_ids"] == expected.token_ids != plain["output_ids"]


def test_routing_policy_model_answers_with_the_policy_it_carries(server, config):
    status, text = http_post(server.http_url, "/v2/models/routing_policy/infer", {"inputs": []})
    assert status == 200, text
    described = json.loads(json.loads(text)["outputs"][0]["data"][0])
    assert described["policy"] == config["policy"]["name"] and described["params"] == config["policy"]["params"]
    assert described["models"] == ["slm", "llm"] and described["entry"] == "slm"


def trt_llm_metrics(server) -> dict[tuple[str, str, str], float]:
    """nv_trt_llm_* samples keyed by (family, our model, label value); each labelled as
    tensorrtllm_backend labels its own (model="tensorrt_llm", version="1")."""
    samples = {}
    for family, labels, value in re.findall(r"^(nv_trt_llm_\w+)\{([^}]*)\} ([0-9.eE+-]+)$", metrics_text(server), re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        assert (labels.pop("model"), labels.pop("version")) == ("tensorrt_llm", "1"), labels
        ours = labels.pop("tokenrouter_model")
        (kind,) = labels.values()
        samples[family, ours, kind] = float(value)
    return samples


def test_a_tensorrt_llm_dashboard_query_finds_its_series(server):
    """The selectors of tensorrtllm_backend's metrics docs, run against our metrics port: one series
    per routed model each, and the timestamp in seconds as its example shows."""
    text = metrics_text(server)

    def select(family: str, **labels: str) -> list[float]:
        lines = [line for line in text.splitlines() if line.startswith(family + "{")]
        return [float(line.rsplit(" ", 1)[1]) for line in lines
                if all(f'{k}="{v}"' in line.split("}")[0] for k, v in labels.items())]

    assert len(select("nv_trt_llm_request_metrics", model="tensorrt_llm", request_type="active")) == 2
    assert len(select("nv_trt_llm_kv_cache_block_metrics", model="tensorrt_llm", kv_cache_block_type="max")) == 2
    stamps = select("nv_trt_llm_general_metrics", model="tensorrt_llm", general_type="timestamp", version="1")
    assert len(stamps) == 2 and all(abs(stamp - time.time()) < 60 for stamp in stamps), stamps


GAUGES = ("tokenrouter_running_requests", "tokenrouter_pending_requests", "tokenrouter_active_requests",
          "tokenrouter_kv_blocks_used")


def test_tensorrt_llm_dashboard_metrics_follow_a_request(server, config):
    """The nv_trt_llm_* families a TensorRT-LLM dashboard reads: the pool size and limits from the
    config at rest, held requests and used blocks while long streams decode, and all back to
    rest after it. Catches families that are not refreshed, swapped used/free, or wrong labels."""
    kv_blocks = {name: spec["kv_cache_tokens"] // spec["block_size"] for name, spec in config["models"].items()}
    # Four streams, not one: a lone request routed 30 % spends much of its time in transit between
    # the stubs (pending at both, running at neither), so a half-second gauge could miss it running.
    done = threading.Event()

    def four_streams() -> None:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda seed: stream_ids(server, PROMPTS[1], max_tokens=200, min_tokens=200,
                                                  random_seed=seed), range(4)))
        done.set()

    worker = threading.Thread(target=four_streams)
    assert wait_for_idle_pools(server) == {}
    rest = trt_llm_metrics(server)
    worker.start()
    busy, peaks = None, {}
    while not done.is_set():
        sample = trt_llm_metrics(server)
        for model, blocks in kv_blocks.items():
            kv = {k: sample["nv_trt_llm_kv_cache_block_metrics", model, k] for k in ("max", "free", "used")}
            assert kv["max"] == blocks and kv["used"] + kv["free"] == blocks, (model, kv)
        if sample["nv_trt_llm_request_metrics", "slm", "active"] >= 1 and \
                sample["nv_trt_llm_kv_cache_block_metrics", "slm", "used"] > 0:
            busy = sample
        for key, value in metrics(server).items():  # and TokenRouter's own gauges
            if key.startswith(GAUGES):
                peaks[key] = max(peaks.get(key, 0.0), value)
        time.sleep(0.1)
    worker.join()
    assert busy is not None, "the metrics never showed the running request"
    # Routing 30 %: both models counted them active and held KV blocks for them the whole time; each ran
    # on one model while the other kept its KV (pending). Which model a twice-a-second refresh catches
    # in which state varies, so those two gauges are asked of either model.
    for gauge in GAUGES:
        per_model = [peaks.get(f'{gauge}{{model="{model}"}}', 0) for model in ("slm", "llm")]
        wanted = max if gauge in ("tokenrouter_running_requests", "tokenrouter_pending_requests") else min
        assert wanted(per_model) >= 1, (gauge, peaks)
    assert wait_for_idle_pools(server) == {}
    time.sleep(0.7)  # one refresh after the pools emptied
    after = trt_llm_metrics(server)
    for model, blocks in kv_blocks.items():
        assert after["nv_trt_llm_kv_cache_block_metrics", model, "tokens_per"] == config["models"][model]["block_size"]
        assert after["nv_trt_llm_kv_cache_block_metrics", model, "used"] == 0
        assert after["nv_trt_llm_kv_cache_block_metrics", model, "fraction"] == 0
        for kind in ("active", "scheduled", "context", "waiting"):
            assert after["nv_trt_llm_request_metrics", model, kind] == 0, (model, kind)
        assert after["nv_trt_llm_request_metrics", model, "max"] == config["scheduling"]["max_active"]
        assert after["nv_trt_llm_inflight_batcher_metrics", model, "paused_requests"] == 0
    steps = after["nv_trt_llm_general_metrics", "slm", "iteration_counter"] - \
        rest["nv_trt_llm_general_metrics", "slm", "iteration_counter"]
    assert steps > 0 and busy["nv_trt_llm_kv_cache_block_metrics", "slm", "fraction"] > 0
