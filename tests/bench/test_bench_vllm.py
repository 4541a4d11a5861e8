"""bench-vllm's engines part on the tiny pair: the three systems it times (our vLLM step engine,
vLLM's own continuous-batching loop on the same engine, our torch engine) produce the same greedy
tokens, so its speed ratios compare equal work; and its report reads the results."""

from __future__ import annotations

import argparse

from tokenrouter_tools.bench_vllm import report_engines, run_worker


def test_engine_worker_systems_agree_token_for_token(tiny_pair):
    args = argparse.Namespace(threads=1, batches=[8], reps=1, new_tokens=6, resume=True, dtype="float32")
    # In a worker process, as the benchmark runs it: vLLM in-process would patch this test
    # process's torch threading for every later test.
    result = run_worker("small", tiny_pair["small"], args)
    batch = result["batches"]["8"]  # through JSON
    assert batch["rows_identical"] == {"adapter": 8, "native": 8, "torch": 8}
    assert set(batch["tok_s"]) == {"adapter", "native", "torch"} and min(batch["tok_s"].values()) > 0
    assert set(result["resume_ms"]) >= {"decode_1", "extend_1", "extend_4", "prefill_prefix+1"}
    table = report_engines([result])
    assert "| small | 8 |" in table and "8/8, 8/8" in table


def test_routing_runs_both_phases_and_reports_the_speedup(tiny_pair):
    """Catches a routing comparison that never ran end to end (its large-alone phase once called
    vLLM's own loop with arguments that loop did not take): TokenRouter on vLLM, then the large
    model alone on vLLM, on the same HumanEval prompts, and the report of both."""
    from tokenrouter_tools.bench_vllm import report_routing, run_routing
    from tokenrouter.launch.serve import TINY_CONFIG, _with_pair

    args = argparse.Namespace(config=_with_pair(TINY_CONFIG, tiny_pair).model_dump(), requests=2, clients=2, cores=1,
                              policy="random", policy_params='{"rate": 0.5}', max_tokens=6, reps=1)
    result = run_routing(args)
    routed, alone = result["runs"]["tokenrouter"][0], result["runs"]["large_alone"][0]
    assert 0 < routed["tokens"] <= 2 * 6 and 0 < alone["tokens"] <= 2 * 6
    assert 0.0 < result["large_share"] < 1.0  # rate 0.5: both models wrote
    assert result["speedup"] == result["tok_s"]["tokenrouter"] / result["tok_s"]["large_alone"]
    assert "speedup" in report_routing(result)
