"""bench-vllm's engines part on the tiny pair: the three systems it times (our vLLM step engine,
vLLM's own continuous-batching loop on the same engine, our torch engine) produce the same greedy
tokens, so its speed ratios compare equal work; and its report reads the results."""

from __future__ import annotations

import argparse

from tokenrouter_tools.bench_vllm import report_engines, run_worker


def test_engine_worker_systems_agree_token_for_token(tiny_pair):
    args = argparse.Namespace(threads=1, batches=[8], reps=1, new_tokens=6, resume=True)
    # In a worker process, as the benchmark runs it: vLLM in-process would patch this test
    # process's torch threading for every later test.
    result = run_worker("small", tiny_pair["small"], args)
    batch = result["batches"]["8"]  # through JSON
    assert batch["rows_identical"] == {"adapter": 8, "native": 8, "torch": 8}
    assert set(batch["tok_s"]) == {"adapter", "native", "torch"} and min(batch["tok_s"].values()) > 0
    assert set(result["resume_ms"]) >= {"decode_1", "extend_1", "extend_4", "prefill_prefix+1"}
    table = report_engines([result])
    assert "| small | 8 |" in table and "8/8, 8/8" in table
