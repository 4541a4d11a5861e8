"""Served vs embedded (issue 4): the same config through a real Triton (gRPC streaming) and
through the embedded Python API, alternating runs at one concurrency, medians of repetitions.

Both stay up for the whole comparison (the server once started and loaded, the embedded runtime
on engines loaded once), so a run measures serving, not start-up. The peer-message round trip
of the served subservers comes from their ``tokenrouter_peer_send_seconds`` histogram on the
metrics port (the difference across each served run).
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

from tokenrouter.config import TokenRouterConfig
from tokenrouter.engine.factory import create_engine
from tokenrouter.runtime.api import TokenRoutingEngine
from tokenrouter.serving.repository import render_repository
from tokenrouter.text import TextCodec

from ..triton_server import Ports, TritonServer, build_backend_dir, find_triton
from . import prometheus
from .compare import side_by_side
from .cpu import group_cpu_seconds, own_cpu_seconds
from .loadgen import run_closed_loop
from .records import summarize
from .report import fmt, ms, pct, table, verdict
from .runner import Timing, median_of, median_row
from .targets import STEP_LOG, EmbeddedTarget, Target
from .triton_target import TritonTarget
from .workloads import TextPrompts, Workload

TARGET = 0.9  # issue 4: served throughput >= 90 % of embedded
PEER_HISTOGRAM = "tokenrouter_peer_send_seconds"


def run_served(config: TokenRouterConfig, clients: int, workload: Workload, timing: Timing, *, reps: int,
               seed: int = 0, log_path: Path | None = None) -> dict[str, Any]:
    if config.scheduling.max_active < clients:
        raise ValueError(f"the config admits {config.scheduling.max_active} requests at once; {clients} clients "
                         f"would queue (raise scheduling.max_active)")
    large = next(name for name in config.model_names if name != config.entry)
    engines = {name: create_engine(name, spec) for name, spec in config.models.items()}
    codec = TextCodec.from_path(config.tokenizer_path, chat_template=config.chat_template)
    install = find_triton()
    with tempfile.TemporaryDirectory(prefix="bench-served-") as tmp:
        repository = render_repository(config, Path(tmp) / "repository")
        log = (log_path or Path(tmp) / "server.log").open("w")
        server = TritonServer(repository, build_backend_dir(install, Path(tmp) / "backends"), install, Ports.free(),
                              host="127.0.0.1", log_sink=lambda line: (log.write(line + "\n"), log.flush()),
                              exit_timeout_s=5)
        metrics_url = f"127.0.0.1:{server.ports.metrics}"
        try:
            server.start().wait_ready(600)

            def cpu_seconds() -> tuple[float, float]:
                """(this process: clients, and the runtime when embedded; the server's process group)"""
                return own_cpu_seconds(), group_cpu_seconds(server.process.pid)

            def run(system: str, rep: int) -> dict[str, Any]:
                target: Target = EmbeddedTarget(TokenRoutingEngine(config, engines=engines, codec=codec, step_log=STEP_LOG), large) \
                    if system == "embedded" else TritonTarget(server.grpc_url, large)
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
                row["cpu_ms_per_token"] = {where: 1e3 * (after - before) / tokens for where, after, before
                                           in zip(("this process", "server"), cpu_seconds(), cpu_before)}
                if system == "served":
                    row["peer_send"] = prometheus.histogram_delta(before, prometheus.scrape(metrics_url),
                                                                  PEER_HISTOGRAM)
                return row

            rows = side_by_side(["embedded", "served"], reps, run, label=f"served vs embedded N={clients}")
        finally:
            server.stop()
            log.close()
            for engine in engines.values():
                engine.close()
    ratios = [s["throughput"] / e["throughput"] for s, e in zip(rows["served"], rows["embedded"])]
    measured = statistics.median(ratios)
    return {"suite": "served", "config": config.model_dump(), "clients": clients, "workload": workload.__dict__,
            "timing": timing.__dict__, "reps": reps, "runs": rows,
            "medians": {system: median_row(runs) for system, runs in rows.items()},
            "ratio": {"per_rep": ratios, "median": measured, "target": TARGET, "verdict": verdict(measured, TARGET)}}


def markdown(result: dict[str, Any]) -> str:
    medians = result["medians"]
    runs = result["runs"]
    rows = [[system, m["throughput"], ", ".join(fmt(x) for x in m["throughput_all"]), ms(m["ttft_median_s"]),
             ms(m["latency_median_s"]), pct(m["large_share"]),
             median_of(r["cpu_ms_per_token"]["this process"] for r in runs[system]),
             median_of(r["cpu_ms_per_token"]["server"] for r in runs[system])] for system, m in medians.items()]
    ratio = result["ratio"]
    parts = [table(["path", "tokens/s (median)", "per repetition", "TTFT ms", "latency ms", "large share",
                    "CPU ms/token, this process", "CPU ms/token, server"], rows),
             table(["served / embedded", "per repetition", "target", "verdict"],
                   [[ratio["median"], ", ".join(fmt(x) for x in ratio["per_rep"]), f">= {ratio['target']}",
                     ratio["verdict"]]])]
    peers = [(rep, model, h) for rep, run in enumerate(result["runs"]["served"])
             for model, h in run.get("peer_send", {}).items()]
    if peers:
        parts.append(table(["repetition", "sending model", "peer calls", "mean ms", "p50 <= ms", "p90 <= ms"],
                           [[rep, model, h["count"], ms(h["mean_s"]), ms(h["p50_le_s"]), ms(h["p90_le_s"])]
                            for rep, model, h in peers]))
    return "\n\n".join(parts)
