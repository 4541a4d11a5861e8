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


def test_routing_runs_every_system_and_reports_the_speedups(tiny_pair):
    """Catches a routing comparison that never ran end to end (its large-alone phase once called
    vLLM's own loop with arguments that loop did not take): TokenRouter embedded, TokenRouter served by
    Triton over gRPC, then the large model alone on vLLM, on the same HumanEval prompts, and the report.
    The served run must give the embedded run's tokens (same prompts as ids and as text, same
    deterministic policy, float32): a served client that tokenized differently, or a front that
    wrapped the rendered chat turn again, would differ."""
    from tokenrouter_tools.bench_vllm import report_routing, run_routing
    from tokenrouter.launch.serve import TINY_CONFIG, _with_pair

    config = _with_pair(TINY_CONFIG, tiny_pair).model_dump()
    for spec in config["models"].values():
        spec["dtype"] = "float32"
    args = argparse.Namespace(config=config, requests=3, clients=2, cores=1, policy="random",
                              policy_params='{"rate": 0.5}', max_tokens=6, reps=1, served=True)
    result = run_routing(args)
    runs = {name: values[0] for name, values in result["runs"].items()}
    assert set(runs) == {"tokenrouter", "tokenrouter_served", "large_alone"}
    for run in runs.values():
        assert 0 < run["tokens"] <= 3 * 6
    assert 0.0 < result["large_share"]["tokenrouter"] < 1.0  # rate 0.5: both models wrote
    assert result["large_share"]["tokenrouter_served"] == result["large_share"]["tokenrouter"]
    assert result["identical_rows"]["tokenrouter_served"] == 3
    assert result["speedup"]["tokenrouter"] == runs["tokenrouter"]["tok_s"] / runs["large_alone"]["tok_s"]
    assert "/ large alone" in report_routing(result)
