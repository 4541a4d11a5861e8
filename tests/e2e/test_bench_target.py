"""The benchmark's Triton target against a real server: closed-loop gRPC streams, token
attribution from `output_models`, the peer round-trip histogram and the engines' busy time read off the
metrics port; and the served suite end to end on the shipped tiny config (one call for all its one-server
and two-server systems)."""

from __future__ import annotations

import pytest

from tokenrouter.config import load_config
from tokenrouter_tools.bench import prometheus
from tokenrouter_tools.bench.busy_sampler import BUSY_COUNTER
from tokenrouter_tools.bench.loadgen import run_closed_loop
from tokenrouter_tools.bench.records import summarize
from tokenrouter_tools.bench.runner import Timing
from tokenrouter_tools.bench.served import PEER_HISTOGRAM, markdown, run_served, two_servers
from tokenrouter_tools.bench.triton_target import TritonTarget
from tokenrouter_tools.bench.workloads import TextPrompts, Workload
from tokenrouter.launch.serve import TINY_CONFIG


def test_triton_target_streams_attributed_tokens_and_the_peer_histogram_moves(routing_server):
    server = routing_server  # the tiny pair, random policy at 30 %
    metrics_url = f"127.0.0.1:{server.ports.metrics}"
    before = prometheus.scrape(metrics_url)
    target = TritonTarget(server.grpc_url, "llm", metrics_urls=[metrics_url])
    workload = Workload("short-long", (8, 16), 24, max_context=512)
    try:
        result = run_closed_loop(target, workload, TextPrompts(), clients=3, warmup_s=0.5, measure_s=2.0)
    finally:
        target.close()
    finished = [r for r in result.records if r.complete]
    assert len({r.client for r in finished}) == 3 and not [r for r in result.records if r.error]
    for r in finished:
        assert r.output_tokens == sum(r.tokens_by_model.values()) > 0 and isinstance(r.output, str)
        assert r.finish_reason in ("length", "eos") and (r.finish_reason == "eos" or r.output_tokens == 24)
    summary = summarize(result.records, result.window, 3, large="llm")
    assert summary.output_tokens > 0 and 0 < summary.large_share < 1
    after = prometheus.scrape(metrics_url)
    peer = prometheus.histogram_delta(before, after, PEER_HISTOGRAM)
    assert peer["slm"]["count"] > 0 and peer["slm"]["mean_s"] > 0
    # each engine's busy time, read while the target ran: within what the counter grew over the whole run
    grew = prometheus.counter_delta(before, after, BUSY_COUNTER)
    for model, spans in result.spans.items():
        assert 0 < sum(end - start for start, end in spans) <= grew[model] + 1e-9, model
    assert set(result.spans) == {"slm", "llm"}


# Two servers with an injected peer delay are one more two-node deployment (2 starts, minutes under load):
# the default run serves without it. What the delay adds is unit-tested (tests/bench/test_served_delays.py:
# the system's name and config, its comparison against none; tests/serving/test_peer_link.py: the link holds
# each batch), and `-m slow` runs the deployment too.
@pytest.mark.timeout(900)  # three server starts (five with the delay): 20-60 s each here, minutes under load
@pytest.mark.parametrize("peer_delays_ms", [(0.0,), pytest.param((0.0, 2.0), marks=pytest.mark.slow)],
                         ids=["no-delay", "and-2ms"])
def test_served_suite_alternates_the_paths_compares_two_servers_and_each_delay_with_none(tiny_pair, peer_delays_ms):
    """embedded, served (gRPC), openai (the OpenAI server beside Triton) and two-servers (one model per
    Triton server on loopback), alternated, and two-servers again with each delay added to every peer
    message: paired ratios, the OpenAI server's and each node's processes in the CPU account, the handoff
    messages counted on both servers, the transport's extra CPU per handoff message. One run_served call:
    each start is 20-60 s here, and the served server is shared by the systems that run on one server."""
    raw = load_config(TINY_CONFIG).model_dump()  # the shipped config, on the pair tiny_pair just built
    raw["frontend"].update(names=["tokenrouter"], one_token_per_response=[])  # one front per server: a shared machine
    result = run_served(load_config(raw), [1, 2], Workload("short-long", (8, 16), 12, max_context=512),
                        Timing(0.3, 1.0), reps=2, systems=("embedded", "served", "openai", "two-servers"),
                        peer_delays_ms=peer_delays_ms)
    delayed_systems = [two_servers(delay) for delay in peer_delays_ms if delay]
    assert result["systems"] == ["embedded", "served", "openai", "two-servers", *delayed_systems]
    assert [p["clients"] for p in result["points"]] == [1, 2]  # all on the same servers
    for point in result["points"]:
        runs, comparisons = point["runs"], point["comparisons"]
        assert [r["rep"] for r in runs["embedded"]] == [r["rep"] for r in runs["served"]] == [0, 1]
        assert comparisons["served / embedded"]["throughput"]["per_rep"] == pytest.approx(
            [s["throughput"] / e["throughput"] for s, e in zip(runs["served"], runs["embedded"])])
        assert comparisons["openai / served"]["throughput"]["per_rep"] == pytest.approx(
            [o["throughput"] / s["throughput"] for o, s in zip(runs["openai"], runs["served"])])
        for run in runs["openai"]:  # its tokens counted per event, its server's CPU beside Triton's
            assert run["output_tokens"] > 0 and 0 < run["large_share"] < 1
            assert run["cpu_ms_per_token"]["server by process"]["server: openai server"] > 0
        for run in runs["served"]:
            cpu = run["cpu_ms_per_token"]
            assert cpu["server"] > 0 and run["output_tokens"] > 0
            # the server's CPU is split over tritonserver and a stub per model, and adds up
            assert {"server: tritonserver", "server: slm", "server: llm"} <= set(cpu["server by process"])
            assert cpu["server"] == pytest.approx(sum(cpu["server by process"].values()))
            assert cpu["server by process"]["server: slm"] > 0
        # busy shares from the embedded step log and, for the served paths, from the servers' counters
        for run in (*runs["embedded"], *runs["served"], *runs["two-servers"]):
            assert set(run["busy"]) == {"slm", "llm"} and run["busy"]["slm"] > 0, run["busy"]
            # each engine's steps over the run: from the step log, or the servers' batch histogram and busy time
            assert set(run["steps"]) == {"slm", "llm"}, run["steps"]
            for steps in run["steps"].values():
                assert steps["steps"] > 0 and steps["rows_per_step"] >= 1 and steps["ms_per_step"] > 0, steps
        assert comparisons["two-servers / served"]["throughput"]["per_rep"] == pytest.approx(
            [t["throughput"] / s["throughput"] for t, s in zip(runs["two-servers"], runs["served"])])
        assert comparisons["two-servers / served"]["throughput"]["target"] == 0.95
        for system in delayed_systems:
            delayed = comparisons[f"{system} / two-servers"]
            assert delayed["throughput"]["verdict"] == "-" and len(delayed["throughput"]["per_rep"]) == 2
        for system in ("two-servers", *delayed_systems):
            for run in runs[system]:
                assert run["handoffs_per_token"] > 0 and set(run["peer_send"]) == {"slm", "llm"}
                by_process = run["cpu_ms_per_token"]["server by process"]
                assert by_process["slm node: slm"] > 0 and by_process["llm node: llm"] > 0
                assert {"slm node: tritonserver", "llm node: tritonserver"} <= set(by_process)
                assert not any(where.endswith("openai server") for where in by_process)  # not theirs
        per_handoff = comparisons["two-servers / served"]["server_cpu"]["difference_per_handoff_us"]
        assert len(per_handoff["per_rep"]) == 2
    text = markdown(result)
    assert "ms per step" in text
    for name in ("served / embedded", "openai / served", "two-servers / served",
                 *(f"{system} / two-servers" for system in delayed_systems)):
        assert name in text
