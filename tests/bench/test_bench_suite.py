"""The benchmark machinery on the simulated engine at tiny sizes (seconds): its accounting, Std.
Serving's correctness and prefix reuse, static batches, thresholds, the CLI end to end.

The simulated clock runs 10-20x faster than the A100 profile here; no test asserts a speed.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from pathlib import Path

import pytest

from tokenrouter.config import load_config
from tokenrouter.policies.base import RoutingPolicy
from tokenrouter.throughput import predict
from tokenrouter_tools.bench.loadgen import run_closed_loop
from tokenrouter_tools.bench.records import RequestRecord, summarize
from tokenrouter.throughput.prefill import PrefillCosts
from tokenrouter_tools.bench.runner import Timing
from tokenrouter_tools.bench.served import run_served
from tokenrouter_tools.bench.stdserving import dispatch
from tokenrouter_tools.bench.setups import LARGE, SMALL, sim_setup
from tokenrouter_tools.bench.systems import SystemFactory, system_config
from tokenrouter_tools.bench.thresholds import random_routing, step_latencies, thresholds_by_n
from tokenrouter_tools.bench.validate import run_validate
from tokenrouter_tools.bench.workloads import Session, TokenPrompts, Workload
from tokenrouter.launch.cli import main

FAST = 0.1  # simulated steps of 0.6 / 2.8 ms


@pytest.fixture(scope="module")
def factory() -> SystemFactory:
    setup = sim_setup(time_scale=FAST)
    return SystemFactory(setup, setup.open_engines(), None)


def short(factory: SystemFactory, tokens: int = 24) -> Workload:
    return factory.setup.with_workload("short-long", tokens)


def test_throughput_is_the_tokens_of_the_window_and_matches_the_engine_steps(factory):
    target = factory.open("slm_only", 3)
    result = run_closed_loop(target, short(factory), factory.setup.source(), clients=3, warmup_s=0.3, measure_s=1.0)
    target.close()
    window = result.window
    summary = summarize(result.records, window, 3, large=LARGE, steps=result.spans)
    arrived = sum(c for r in result.records for at, c in r.arrivals if window.start <= at < window.end)
    assert summary.output_tokens == arrived > 50
    assert summary.throughput == pytest.approx(arrived / window.length)
    # every row of an slm_only step commits one token, streamed right after the step: the steps
    # that ended in the window account for the same tokens, up to the steps at its two edges
    rows = sum(len(r.rows) for r in target.engine.subservers[SMALL].step_log if window.start <= r.end < window.end)
    assert abs(rows - arrived) <= 2 * 3
    assert summary.large_share == 0.0 and summary.busy[LARGE] == 0.0 and 0 < summary.busy[SMALL] <= 1


def test_std_serving_writes_the_runtimes_tokens_and_reuses_each_requests_prefix(factory):
    source = factory.setup.source()
    prompts = [source.make(random.Random(i), 40) for i in range(4)]
    runtime, std = factory.open("eager_async", 1), factory.open("std_serving", 1)
    try:
        served = [runtime.generate(p, max_tokens=24, seed=i, deadline=float("inf")) for i, p in enumerate(prompts)]
        plain = [std.generate(p, max_tokens=24, seed=i, deadline=float("inf")) for i, p in enumerate(prompts)]
        assert [r.output for r in plain] == [r.output for r in served]
        assert [r.tokens_by_model for r in plain] == [r.tokens_by_model for r in served]
        assert [r.output_tokens for r in plain] == [len(r.output) for r in served]
        stats = {name: server.cache.stats for name, server in std.servers.items()}
        visited_large = sum(1 for r in plain if r.tokens_by_model[LARGE])
        assert 0 < visited_large < len(prompts) + 1
        # only a request's first call on each model computes its prompt; every later call reuses
        assert stats[SMALL].lookups - stats[SMALL].hits == len(prompts)
        assert stats[LARGE].lookups - stats[LARGE].hits == visited_large
        assert stats[SMALL].hit_tokens > 40 * len(prompts) and stats[SMALL].evictions == 0
    finally:
        runtime.close()
        std.close()
    assert all(engine.num_used_blocks == 0 for engine in factory.engines.values())


def test_std_serving_evicts_least_recently_used_under_kv_pressure_and_stays_correct():
    setup = sim_setup(time_scale=FAST)
    for spec in setup.models.values():
        spec.update(kv_cache_tokens=16 * 12, block_size=16)  # room for about three contexts
    small = SystemFactory(setup, setup.open_engines(), None)
    prompts = [setup.source().make(random.Random(i), 30) for i in range(6)]
    runtime, std = small.open("eager_async", 1), small.open("std_serving", 1)
    try:
        expected = [runtime.generate(p, max_tokens=16, seed=i, deadline=float("inf")).output
                    for i, p in enumerate(prompts)]
        assert [std.generate(p, max_tokens=16, seed=i, deadline=float("inf")).output
                for i, p in enumerate(prompts)] == expected
        assert sum(server.cache.stats.evictions for server in std.servers.values()) > 0
    finally:
        runtime.close()
        std.close()


def rounds_are_separate(records) -> bool:
    """Whether every client's k-th request started after every (k-1)-th request had ended."""
    by_round = defaultdict(list)
    per_client = defaultdict(int)
    for r in sorted(records, key=lambda r: r.submitted):
        by_round[per_client[r.client]].append(r)
        per_client[r.client] += 1
    return all(min(r.submitted for r in by_round[k]) >= max(r.finished for r in by_round[k - 1])
               for k in range(1, len(by_round)))


def test_lockstep_sends_static_batches_and_the_closed_loop_does_not(factory):
    workload = short(factory, 16)
    for system, separate in (("r2r_lockstep", True), ("eager_async", False)):
        target = factory.open(system, 3)
        result = run_closed_loop(target, workload, factory.setup.source(), clients=3, warmup_s=0.0, measure_s=1.5,
                                 lockstep=system == "r2r_lockstep")
        target.close()
        counts = defaultdict(int)
        for r in result.records:
            counts[r.client] += 1
        assert min(counts.values()) >= 3
        assert rounds_are_separate(result.records) is separate, system


def test_thresholds_from_the_model_never_deadlock_and_configs_accept_them(factory):
    latencies = [step_latencies(factory.engines[name], 8) for name in (SMALL, LARGE)]
    assert latencies[1][0] == pytest.approx(0.0279)  # the profile's A100 numbers, whatever the time scale
    by_n = thresholds_by_n(0.35, latencies, 8)
    assert all(sum(b[n - 1] - 1 for b in by_n) < n for n in range(1, 9))
    assert by_n[1][3] == 3  # the paper's example: B_1* = 3 at N = 4
    load_config(system_config(factory.setup, "tokenrouter", 8, by_n))


def answered(output: list[int]) -> RequestRecord:
    record = RequestRecord()
    record.finish("length", output)
    return record


def test_the_dispatcher_records_a_text_prompt_without_a_tokenizer_as_an_error():
    record = dispatch({}, RoutingPolicy(["slm", "llm"], "slm"), "slm", "def f():", codec=None, end_ids=[],
                      max_model_len=64, max_tokens=4, seed=0, deadline=float("inf"))
    assert record.finish_reason == "error" and "needs a tokenizer" in (record.error or ""), record


def test_the_served_suite_refuses_a_config_without_a_tokenizer():
    config = load_config({"models": {"slm": {"engine": "simulated", "profile": "tiny-cpu-small"},
                                     "llm": {"engine": "simulated", "profile": "tiny-cpu-large"}}})
    with pytest.raises(ValueError, match="the config needs a tokenizer"):
        run_served(config, [1], Workload("short-long", (8, 16), 12, max_context=512), Timing(0.3, 1.0), reps=1,
                   systems=("served",))


def test_multi_turn_prompts_carry_the_conversation():
    workload = Workload("multi-turn", (3, 5), 4, turns=3, max_context=100)
    session = Session(workload, TokenPrompts(64, 63), seed=1, client=0)
    first = session.next_prompt(None)
    answer = answered([7, 8])
    second = session.next_prompt(answer)
    assert second[:len(first) + 2] == first + [7, 8] and len(second) > len(first) + 2
    third = session.next_prompt(answered([9]))
    assert third[:len(second) + 1] == second + [9]
    fourth = session.next_prompt(answered([1]))  # three turns done: a new conversation
    assert len(fourth) <= 5 and 63 not in first + second + third + fourth


def test_validation_predicts_each_cell_with_the_model():
    result = run_validate([2], Timing(0.2, 0.6), reps=1, max_tokens=16, time_scale=0.2)
    cells = {c["B1"]: c for c in result["cells"]}
    assert sorted(cells) == [1, 2]
    P, C = random_routing(0.35)
    L = [[x / 1e3 for x in result["latencies_ms"][name][:2]] for name in (SMALL, LARGE)]
    assert cells[2]["predicted"] == pytest.approx(predict(P, C, L, [1, 2], 2, 1e-4, snap=True))
    assert all(c["measured"] > 0 and 0 < c["realized_rate"] < 1 for c in cells.values())
    assert result["best"][0]["predicted_B1"] == 2
    control = result["control"][0]  # the small model alone: exactly N tokens per step of L_0(N)
    assert control["exact"] == pytest.approx(2 / L[0][1]) and control["measured"] > 0


def test_cli_compare_writes_json_with_per_repetition_ratios_and_a_plot(tmp_path: Path):
    out, png = tmp_path / "compare.json", tmp_path / "compare.png"
    code = main(["bench", "compare", "--pair", "sim", "--clients", "2", "--systems", "eager_async", "tokenrouter",
                 "--reps", "2", "--warmup-s", "0.2", "--measure-s", "0.6", "--max-tokens", "16",
                 "--json", str(out), "--plot", str(png)])
    assert code == 0 and png.stat().st_size > 0
    result = json.loads(out.read_text())
    runs = result["runs"]
    assert [r["rep"] for r in runs["tokenrouter"]] == [0, 1]
    ratio = result["ratios"][0]
    assert ratio["denominator"] == "eager_async"
    assert ratio["per_rep"] == pytest.approx([a["throughput"] / b["throughput"]
                                              for a, b in zip(runs["tokenrouter"], runs["eager_async"])])
    assert [c["ratio"] for c in result["checks"]] == ["tokenrouter / eager_async"]


def test_validation_with_prefill_costs_charges_the_profiles_prices():
    """--prefill-cost: each cell is predicted with the profiles' per-token prices and the workload's
    lengths, next to the decode-only prediction; the starvation guard runs on the simulated clock."""
    result = run_validate([2], Timing(0.2, 0.6), reps=1, max_tokens=8, time_scale=0.2, workload_kind="long-short",
                          prefill_cost=True, monte_carlo=2000)
    assert result["setup"]["max_wait_ms"] == pytest.approx(200.0 * 0.2)
    prefill = PrefillCosts((1e-5, 5e-5), (1024, 2048), 8)
    assert result["prefill"]["per_token_s"] == prefill.per_token_s
    cell = {c["B1"]: c for c in result["cells"]}[1]
    P, C = random_routing(cell["realized_rate"])
    L = [[x / 1e3 for x in result["latencies_ms"][name][:2]] for name in (SMALL, LARGE)]
    assert cell["predicted_at_realized"] == pytest.approx(predict(P, C, L, [1, 1], 2, 1e-4, snap=True, prefill=prefill))
    assert cell["decode_only_at_realized"] > 1.2 * cell["predicted_at_realized"]  # 1.5k-token prefills are dear
    assert cell["simulated_at_realized"] > 0
