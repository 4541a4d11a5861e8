"""Std. Serving on real vLLM OpenAI servers: the one-token call's answer as logits, the per-call split
from vLLM's metrics, and (slow: two real vLLM servers) the dispatcher's greedy output at routing share 0
and 1 against each server's own greedy completion."""

from __future__ import annotations

import http.client
import json

import pytest
import torch

from tokenrouter.policies import create_policy
from tokenrouter_tools.bench.vllm_serving import call_split
from tokenrouter_tools.bench.vllm_std_serving import VllmStdServingTarget, top_logprobs_as_logits, vocab_size


def test_top_logprobs_become_logits_with_minus_inf_elsewhere() -> None:
    logits = top_logprobs_as_logits({"token_id:7": -0.1, "token_id:3": -2.5}, 10)
    assert int(logits.argmax()) == 7
    assert logits[3] == -2.5 and logits[7] == pytest.approx(-0.1)
    assert torch.isinf(logits).sum() == 8
    with pytest.raises(ValueError, match="not a token id"):
        top_logprobs_as_logits({"hello": -0.1}, 10)


def test_call_split_per_call_from_metric_differences() -> None:
    def samples(calls: float, e2e: float, queue: float, prefill: float, prompt: float, queries: float, hits: float):
        return {("vllm:e2e_request_latency_seconds_count", frozenset()): calls,
                ("vllm:e2e_request_latency_seconds_sum", frozenset()): e2e,
                ("vllm:request_queue_time_seconds_sum", frozenset()): queue,
                ("vllm:request_prefill_time_seconds_sum", frozenset()): prefill,
                ("vllm:request_inference_time_seconds_sum", frozenset()): prefill,
                ("vllm:prompt_tokens_total", frozenset()): prompt,
                ("vllm:prefix_cache_queries_total", frozenset()): queries,
                ("vllm:prefix_cache_hits_total", frozenset()): hits}

    before = samples(10, 1.0, 0.1, 0.5, 1000, 1000, 900)
    after = samples(20, 3.0, 0.3, 1.5, 3000, 3000, 2600)  # 10 calls: 2 s e2e, 0.2 s queue, 1 s prefill
    split = call_split(before, after, {"client_ms_per_call": 250.0})
    assert split["calls"] == 10
    assert split["e2e_request_latency_ms"] == pytest.approx(200.0)
    assert split["request_queue_time_ms"] == pytest.approx(20.0)
    assert split["request_prefill_time_ms"] == pytest.approx(100.0)
    assert split["outside_engine_ms"] == pytest.approx(50.0)
    assert split["context_tokens"] == pytest.approx(200.0)
    assert split["computed_tokens"] == pytest.approx(30.0)  # 2000 queried - 1700 hit, per call
    assert call_split(after, after, {"client_ms_per_call": 0.0}) == {}


def _greedy(url: str, model: str, prompt: list[int], n: int) -> list[int]:
    """The server's own greedy completion of ``prompt``, as token ids."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=120)
    connection.request("POST", "/v1/completions", body=json.dumps(
        {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "logprobs": 1,
         "return_tokens_as_token_ids": True}), headers={"Content-Type": "application/json"})
    reply = json.loads(connection.getresponse().read())
    connection.close()
    return [int(t.split(":")[1]) for t in reply["choices"][0]["logprobs"]["tokens"]]


@pytest.mark.slow
def test_dispatcher_on_two_vllm_servers_equals_each_models_greedy(tiny_pair) -> None:
    """Share 0: every token from the small server, as its own greedy completion; share 1: every token
    from the large one, as its own. Both servers are real vLLM OpenAI servers (float32, one core each)."""
    from tokenrouter_tools.bench.vllm_serve import VllmServe

    servers = {"slm": VllmServe("slm", tiny_pair["small"], [0], dtype="float32", max_num_seqs=2, max_model_len=512),
               "llm": VllmServe("llm", tiny_pair["large"], [1 % 2], dtype="float32", max_num_seqs=2,
                                max_model_len=512)}
    prompts = [[5, 17, 42, 9, 100, 31, 7], list(range(40, 80))]
    n = 12
    try:
        for server in servers.values():
            server.start().wait_ready(600)
        urls = {name: s.url for name, s in servers.items()}
        for rate, reference in ((0.0, "slm"), (1.0, "llm")):
            policy = create_policy("random", ["slm", "llm"], "slm", {"rate": rate})
            target = VllmStdServingTarget(urls, policy, large="llm", vocab=vocab_size(tiny_pair["small"]),
                                          codec=None, end_ids=[], max_model_len=512)
            try:
                for prompt in prompts:
                    record = target.generate(prompt, max_tokens=n, seed=3, deadline=float("inf"))
                    assert record.error is None, record.error
                    assert record.output == _greedy(urls[reference], reference, prompt, n)
                    assert record.tokens_by_model[reference] == n
            finally:
                target.close()
            assert target.calls.seconds[reference]  # the calls were made, and timed
    finally:
        for server in servers.values():
            server.stop()
