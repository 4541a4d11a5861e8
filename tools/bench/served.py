"""Served vs embedded (issues 4 and 14): the same config through a real Triton (gRPC streaming)
and through the embedded Python API, alternating runs at each concurrency, medians of repetitions.

Both stay up for the whole comparison (the server once started and loaded, the embedded runtime
on engines loaded once), so a run measures serving, not start-up. Every concurrency N runs on the
same server. The peer-message round trip of the served subservers comes from their
``tokenrouter_peer_send_seconds`` histogram on the metrics port (the difference across each served
run); server CPU is counted per process of the server's group (tritonserver, each model's stub).
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any, Sequence

from tokenrouter.config import TokenRouterConfig
from tokenrouter.engine.base import Engine
from tokenrouter.engine.factory import create_engine
from tokenrouter.launch.triton_server import Ports, TritonServer, build_backend_dir, find_triton
from tokenrouter.runtime.api import TokenRouter
from tokenrouter.serving.repository import render_repository
from tokenrouter.text import TextCodec

from . import prometheus
from .compare import side_by_side
from .cpu import group_cpu_by_process, own_cpu_seconds
from .loadgen import run_closed_loop
from .records import summarize
from .report import fmt, ms, pct, table, verdict
from .runner import Timing, median_of, median_row
from .targets import STEP_LOG, EmbeddedTarget, Target
from .triton_target import TritonTarget
from .workloads import TextPrompts, Workload

TARGET = 0.9  # issues 4 and 14: served throughput >= 90 % of embedded
CPU_TARGET_MS = 0.5  # issue 14: server CPU per output token
TTFT_TARGET = 2.0  # issue 14: served TTFT p50 <= 2x embedded
PEER_HISTOGRAM = "tokenrouter_peer_send_seconds"
SYSTEMS = ("embedded", "served")


def run_served(config: TokenRouterConfig, clients: Sequence[int], workload: Workload, timing: Timing, *, reps: int,
               seed: int = 0, log_path: Path | None = None) -> dict[str, Any]:
    """One server and one set of engines for every concurrency in ``clients``."""
    if config.scheduling.max_active < max(clients):
        raise ValueError(f"the config admits {config.scheduling.max_active} requests at once; {max(clients)} "
                         f"clients would queue (raise scheduling.max_active)")
    engines = {name: create_engine(name, spec) for name, spec in config.models.items()}
    codec = TextCodec.from_path(config.tokenizer_path, chat_template=config.chat_template)
    install = find_triton()
    with tempfile.TemporaryDirectory(prefix="bench-served-") as tmp:
        repository = render_repository(config, Path(tmp) / "repository")
        log = (log_path or Path(tmp) / "server.log").open("w")
        server = TritonServer(repository, build_backend_dir(install, Path(tmp) / "backends"), install, Ports.free(),
                              host="127.0.0.1", log_sink=lambda line: (log.write(line + "\n"), log.flush()),
                              exit_timeout_s=5)
        try:
            server = server.start_ready(600)
            points = [_compare_at(n, config, engines, codec, server, workload, timing, reps, seed) for n in clients]
        finally:
            server.stop()
            log.close()
            for engine in engines.values():
                engine.close()
    return {"suite": "served", "config": config.model_dump(), "clients": list(clients),
            "workload": workload.__dict__, "timing": timing.__dict__, "reps": reps, "points": points}


def _compare_at(clients: int, config: TokenRouterConfig, engines: dict[str, Engine], codec: TextCodec,
                server: TritonServer, workload: Workload, timing: Timing, reps: int, seed: int) -> dict[str, Any]:
    large = next(name for name in config.model_names if name != config.entry)
    metrics_url = f"127.0.0.1:{server.ports.metrics}"

    def cpu_seconds() -> dict[str, float]:
        """this process (the clients, and the runtime when embedded) and each process of the server"""
        return {"this process": own_cpu_seconds(),
                **{f"server: {name}": s for name, s in group_cpu_by_process(server.process.pid).items()}}

    def run(system: str, rep: int) -> dict[str, Any]:
        target: Target = EmbeddedTarget(TokenRouter(config, engines=engines, codec=codec, step_log=STEP_LOG),
                                        large) if system == "embedded" else TritonTarget(server.grpc_url, large)
        before = prometheus.scrape(metrics_url) if system == "served" else {}
        cpu_before = cpu_seconds()
        try:
            result = run_closed_loop(target, workload, TextPrompts(), clients=clients, seed=seed + rep,
                                     warmup_s=timing.warmup_s, measure_s=timing.measure_s)
        finally:
            target.close()
        row = summarize(result.records, result.window, clients, large=large, steps=result.spans).as_dict()
        # over the whole run (warm-up included), per output token
        tokens = max(1, sum(r.output_tokens for r in result.records))
        cpu = {where: 1e3 * (seconds - cpu_before.get(where, 0.0)) / tokens for where, seconds in cpu_seconds().items()}
        row["cpu_ms_per_token"] = {"this process": cpu.pop("this process"), "server": sum(cpu.values()),
                                   "server by process": cpu}
        if system == "served":
            after = prometheus.scrape(metrics_url)
            row["peer_send"] = prometheus.histogram_delta(before, after, PEER_HISTOGRAM)
            row["triton_queue"] = prometheus.triton_queue_delta(before, after)
            # what the writer's rounds did: output tokens per streamed response, as the client saw them
            row["tokens_per_response"] = tokens / max(1, sum(len(r.arrivals) for r in result.records))
        return row

    rows = side_by_side(list(SYSTEMS), reps, run, label=f"served vs embedded N={clients}")
    ratios = [s["throughput"] / e["throughput"] for s, e in zip(rows["served"], rows["embedded"])]
    ttft_ratios = [s["ttft_median_s"] / e["ttft_median_s"] for s, e in zip(rows["served"], rows["embedded"])
                   if s["ttft_median_s"] and e["ttft_median_s"]]
    medians = {system: {**median_row(runs), **_cpu_medians(runs)} for system, runs in rows.items()}
    measured = statistics.median(ratios)
    ttft = statistics.median(ttft_ratios) if ttft_ratios else None
    server_cpu = medians["served"]["cpu_ms_per_token"]["server"]
    return {"clients": clients, "runs": rows, "medians": medians,
            "ratio": {"per_rep": ratios, "median": measured, "target": TARGET, "verdict": verdict(measured, TARGET)},
            "ttft_ratio": {"per_rep": ttft_ratios, "median": ttft, "target": TTFT_TARGET,
                           "verdict": "-" if ttft is None else ("met" if ttft <= TTFT_TARGET else "not met")},
            "server_cpu": {"median_ms": server_cpu, "target_ms": CPU_TARGET_MS,
                           "verdict": "met" if server_cpu <= CPU_TARGET_MS else "not met"}}


def _cpu_medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    processes = sorted({p for r in runs for p in r["cpu_ms_per_token"]["server by process"]})
    return {"cpu_ms_per_token": {
        "this process": median_of(r["cpu_ms_per_token"]["this process"] for r in runs),
        "server": median_of(r["cpu_ms_per_token"]["server"] for r in runs),
        "server by process": {p: median_of(r["cpu_ms_per_token"]["server by process"].get(p) for r in runs)
                              for p in processes}}}


def markdown(result: dict[str, Any]) -> str:
    points = result["points"]
    rows = [[p["clients"], system, m["throughput"], ", ".join(fmt(x) for x in m["throughput_all"]),
             ms(m["ttft_median_s"]), ms(m["latency_median_s"]), pct(m["large_share"]),
             m["cpu_ms_per_token"]["this process"], m["cpu_ms_per_token"]["server"]]
            for p in points for system, m in p["medians"].items()]
    parts = [table(["N", "path", "tokens/s (median)", "per repetition", "TTFT p50 ms", "latency ms", "large share",
                    "CPU ms/token, this process", "CPU ms/token, server"], rows),
             table(["N", "served / embedded", "per repetition", f"verdict (>= {TARGET})", "TTFT served / embedded",
                    f"verdict (<= {TTFT_TARGET})", "server CPU ms/token", f"verdict (<= {CPU_TARGET_MS})"],
                   [[p["clients"], p["ratio"]["median"], ", ".join(fmt(x) for x in p["ratio"]["per_rep"]),
                     p["ratio"]["verdict"], p["ttft_ratio"]["median"], p["ttft_ratio"]["verdict"],
                     p["server_cpu"]["median_ms"], p["server_cpu"]["verdict"]] for p in points])]
    queued = sorted({model for p in points for run in p["runs"]["served"] for model in run["triton_queue"]})
    rows = [[p["clients"], median_of(r["tokens_per_response"] for r in p["runs"]["served"]),
             *[median_of(r["triton_queue"].get(model, {}).get(key) for r in p["runs"]["served"])
               for model in queued for key in ("requests", "queue_ms")]] for p in points]
    parts.append(table(["N", "served tokens per response", *[f"{model}: {what}" for model in queued
                                                             for what in ("requests", "queue ms")]], rows))
    processes = sorted({name for p in points for name in p["medians"]["served"]["cpu_ms_per_token"]["server by process"]})
    parts.append(table(["N", *[f"served CPU ms/token, {name}" for name in processes]],
                       [[p["clients"], *[p["medians"]["served"]["cpu_ms_per_token"]["server by process"].get(name)
                                         for name in processes]] for p in points]))
    peers = [(p["clients"], model, [run["peer_send"][model] for run in p["runs"]["served"] if model in run["peer_send"]])
             for p in points for model in sorted({m for run in p["runs"]["served"] for m in run["peer_send"]})]
    if peers:
        parts.append(table(["N", "sending model", "peer calls per run (median)", "mean ms (median)"],
                           [[n, model, median_of(h["count"] for h in hs), ms(median_of(h["mean_s"] for h in hs))]
                            for n, model, hs in peers]))
    return "\n\n".join(parts)

