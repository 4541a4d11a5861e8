"""Served vs embedded, the OpenAI path vs the gRPC path, and one model
per server vs one server: the same config through a real Triton (gRPC streaming), through
the OpenAI-compatible server beside it (SSE over HTTP, then the same gRPC stream), through two
Triton servers on loopback with one model each (peer messages over the gRPC links, optionally with an
injected delay per message: ``two-servers+0.5ms``) and through the embedded Python API, alternating
runs at each concurrency, medians of repetitions.

Both stay up for the whole comparison (the server once started and loaded, the embedded runtime
on engines loaded once), so a run measures serving, not start-up. Every concurrency N runs on the
same server. The peer-message round trip of the served subservers comes from their
``tokenrouter_peer_send_seconds`` histogram on the metrics port (the difference across each served
run), each engine's busy share of the window from their busy-seconds counters (``busy_sampler``) as the
embedded runtime's comes from its step log; server CPU is counted per process of the server's group
(tritonserver, each model's stub).
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from tokenrouter.config import TokenRouterConfig
from tokenrouter.engine.base import Engine
from tokenrouter.engine.factory import create_engine
from tokenrouter.launch.free_ports import free_port
from tokenrouter.launch.openai_process import OpenAIServer
from tokenrouter.launch.triton_install import build_backend_dir, find_triton
from tokenrouter.launch.triton_server import Ports, TritonServer
from tokenrouter.runtime.api import TokenRouter
from tokenrouter.serving.repository import render_repository
from tokenrouter.text import TextCodec

from . import prometheus
from .busy_sampler import BUSY_COUNTER
from .compare import side_by_side
from .cpu import group_cpu_by_process, own_cpu_seconds
from .fleet import FRONTEND, Fleet
from .records import summarize
from .report import fmt, ms, pct, table, verdict
from .runner import Timing, closed_loop, median_of, median_row
from .targets import STEP_LOG, EmbeddedTarget, Target
from .openai_target import OpenAITarget
from .placed import LoopbackNodes, free_ports, on_loopback
from .triton_target import TritonTarget
from .workloads import TextPrompts, Workload

SYSTEMS = ("embedded", "served", "openai", "two-servers", "dynamo")
DYNAMO = "dynamo"  # one replica of the pair behind NVIDIA Dynamo's frontend (tokenrouter fleet)
DEFAULT_SYSTEMS = ("embedded", "served")
TWO_SERVERS = "two-servers"
PEER_HISTOGRAM = "tokenrouter_peer_send_seconds"
BATCH_HISTOGRAM = "tokenrouter_batch_size"  # rows per engine step
HANDOFFS = "tokenrouter_handoffs_total"
OPENAI_SERVER = "openai server"  # its process's name among the server's


def two_servers(delay_ms: float) -> str:
    """The system name of two servers whose peer messages wait ``delay_ms`` each."""
    return TWO_SERVERS if delay_ms == 0 else f"{TWO_SERVERS}+{delay_ms:g}ms"


def peer_delay_ms(system: str) -> float:
    """The delay a ``two_servers`` system name carries (0 without one)."""
    return float(system.split("+")[1][:-2]) if "+" in system else 0.0


@dataclass(frozen=True)
class Comparison:
    """``numerator`` against ``denominator`` at one N, with its targets: throughput ratio at least
    ``throughput``, TTFT ratio at most ``ttft``; server CPU per output token at most ``cpu_ms``: the
    numerator's whole server's, or (``added_by``) that of the one process its path adds. The difference
    of the two servers' totals is reported too; on a shared machine it also holds the noise of every
    other process."""

    numerator: str
    denominator: str
    throughput: float | None  # None: measured, no target (e.g. an injected delay's cost)
    ttft: float | None
    cpu_ms: float | None
    added_by: str | None = None

    @property
    def name(self) -> str:
        return f"{self.numerator} / {self.denominator}"


COMPARISONS = (
    Comparison("served", "embedded", throughput=0.9, ttft=2.0, cpu_ms=0.5),
    Comparison("openai", "served", throughput=0.95, ttft=1.2, cpu_ms=0.1, added_by=f"server: {OPENAI_SERVER}"),
    Comparison(TWO_SERVERS, "served", throughput=0.95, ttft=1.2, cpu_ms=None),
    # the added hop: Dynamo's frontend (its worker runs the pair, as Triton does for `served`)
    Comparison(DYNAMO, "served", throughput=0.95, ttft=1.2, cpu_ms=None, added_by=f"fleet: {FRONTEND}"),
)


def step_stats(steps: int, rows: float, busy_s: float) -> dict[str, float]:
    """A model's engine steps over a whole run (warm-up too): how many, rows per step, ms per step."""
    return {"steps": steps, "rows_per_step": rows / steps, "ms_per_step": 1e3 * busy_s / steps}


def delay_comparisons(delays_ms: Sequence[float]) -> list[Comparison]:
    """Each injected delay against none (the throughput model's prediction is apart)."""
    return [Comparison(two_servers(d), TWO_SERVERS, throughput=None, ttft=None, cpu_ms=None) for d in delays_ms if d]


def run_served(config: TokenRouterConfig, clients: Sequence[int], workload: Workload, timing: Timing, *, reps: int,
               seed: int = 0, log_path: Path | None = None, systems: Sequence[str] = DEFAULT_SYSTEMS,
               peer_delays_ms: Sequence[float] = (0.0,)) -> dict[str, Any]:
    """One server (and the OpenAI server beside it, when measured), one set of engines (when the
    embedded runtime is measured) and, for ``two-servers``, a deployment with one model per server
    for each of ``peer_delays_ms``, for every concurrency in ``clients``."""
    if config.scheduling.max_active < max(clients):
        raise ValueError(f"the config admits {config.scheduling.max_active} requests at once; {max(clients)} "
                         f"clients would queue (raise scheduling.max_active)")
    engines = ({name: create_engine(name, spec) for name, spec in config.models.items()}
               if "embedded" in systems else {})
    if config.tokenizer_path is None:
        raise ValueError("the served suite sends text: the config needs a tokenizer (tokenizer, or the entry "
                         "model's path)")
    codec = TextCodec.from_path(config.tokenizer_path, chat_template=config.chat_template)
    install = find_triton()
    with tempfile.TemporaryDirectory(prefix="bench-served-") as tmp:
        repository = render_repository(config, Path(tmp) / "repository")
        log = (log_path or Path(tmp) / "server.log").open("w")

        def sink(line: str) -> None:
            log.write(line + "\n")
            log.flush()

        backend_dir = build_backend_dir(install, Path(tmp) / "backends")
        server = TritonServer(repository, backend_dir, install, Ports.free(), host="127.0.0.1", log_sink=sink,
                              exit_timeout_s=5)
        api = OpenAIServer(repository, server.grpc_url, port=free_port(), log_sink=sink, drain_timeout_s=5)
        placed: dict[str, LoopbackNodes] = {}
        fleets = {DYNAMO: Fleet(config, 1, Path(tmp) / DYNAMO)} if DYNAMO in systems else {}
        if TWO_SERVERS in systems:
            systems = [s for s in systems if s != TWO_SERVERS] + [two_servers(d) for d in peer_delays_ms]
        try:
            server = server.start_ready(600)
            for fleet in fleets.values():
                fleet.start()
            if "openai" in systems:
                api.triton_url = server.grpc_url
                api.start().wait_ready(300)
            for delay in peer_delays_ms if any(s.startswith(TWO_SERVERS) for s in systems) else ():
                ports = dict(zip(config.model_names, free_ports(len(config.models))))
                placed[two_servers(delay)] = LoopbackNodes(
                    on_loopback(config, ports, delay), ports, Path(tmp) / two_servers(delay), install, backend_dir,
                    sink).start_all()
            points = [_compare_at(n, config, engines, codec, server, api, placed, fleets, workload, timing, reps,
                                  seed, systems) for n in clients]
        finally:
            for fleet in fleets.values():
                fleet.stop()
            for nodes in placed.values():
                nodes.stop()
            api.stop(grace_s=5)
            server.stop()
            log.close()
            for engine in engines.values():
                engine.close()
    return {"suite": "served", "config": config.model_dump(), "clients": list(clients), "systems": list(systems),
            "peer_delays_ms": list(peer_delays_ms), "workload": workload.__dict__, "timing": timing.__dict__,
            "reps": reps, "points": points}


def _compare_at(clients: int, config: TokenRouterConfig, engines: dict[str, Engine], codec: TextCodec,
                server: TritonServer, api: OpenAIServer, placed: dict[str, LoopbackNodes], fleets: dict[str, Fleet],
                workload: Workload, timing: Timing, reps: int, seed: int, systems: Sequence[str]) -> dict[str, Any]:
    large = next(name for name in config.model_names if name != config.entry)

    def servers(system: str) -> dict[str, TritonServer]:
        """The Triton servers a system runs on, by what names their processes (one server: "server")."""
        return {f"{model} node": node for model, node in placed[system].servers.items()} \
            if system in placed else {"server": server}

    def cpu_seconds(system: str) -> dict[str, float]:
        """this process (the clients, and the runtime when embedded) and each process of the system's servers"""
        seconds = {"this process": own_cpu_seconds()}
        if system in fleets:
            return {**seconds, **{f"fleet: {name}": s for name, s in fleets[system].cpu_seconds().items()}}
        for where, triton in servers(system).items():
            seconds.update({f"{where}: {name}": s for name, s in group_cpu_by_process(triton.running.pid).items()})
        if api.alive() and system not in placed:
            seconds[f"server: {OPENAI_SERVER}"] = sum(group_cpu_by_process(api.running.pid).values())
        return seconds

    def scrape(system: str) -> dict[str, prometheus.Samples]:
        """Triton's metrics of the system's servers (none for Dynamo's fleet)"""
        return {} if system in fleets else {where: prometheus.scrape(f"127.0.0.1:{triton.ports.metrics}")
                                            for where, triton in servers(system).items()}

    def target(system: str) -> Target:
        if system == "embedded":
            return EmbeddedTarget(TokenRouter(config, engines=engines, codec=codec, step_log=STEP_LOG), large)
        if system in fleets:
            return fleets[system].target(large)
        metrics = [f"127.0.0.1:{triton.ports.metrics}" for triton in servers(system).values()]
        if system in placed:
            return TritonTarget(placed[system].entry.grpc_url, large, metrics_urls=metrics)
        return TritonTarget(server.grpc_url, large, metrics_urls=metrics) if system == "served" \
            else OpenAITarget(api.url, large)

    def run(system: str, rep: int) -> dict[str, Any]:
        served = system != "embedded"
        before = scrape(system) if served else {}
        cpu_before = cpu_seconds(system)
        measured = target(system)
        result = closed_loop(measured, workload, TextPrompts(), clients=clients, timing=timing, seed=seed + rep)
        row = summarize(result.records, result.window, clients, large=large, steps=result.spans).as_dict()
        if isinstance(measured, EmbeddedTarget):
            logs = {name: list(sub.step_log) for name, sub in measured.engine.subservers.items() if sub.step_log}
            row["steps"] = {name: step_stats(len(log), sum(r.batch_size for r in log),
                                             sum(r.end - r.start for r in log)) for name, log in logs.items()}
        # over the whole run (warm-up included), per output token; the OpenAI server counts only where it works
        tokens = max(1, sum(r.output_tokens for r in result.records))
        cpu = {where: 1e3 * (seconds - cpu_before.get(where, 0.0)) / tokens
               for where, seconds in cpu_seconds(system).items()
               if system == "openai" or not where.endswith(OPENAI_SERVER)}
        row["cpu_ms_per_token"] = {"this process": cpu.pop("this process"), "server": sum(cpu.values()),
                                   "server by process": cpu}
        if served:
            after = scrape(system)
            row["peer_send"], row["triton_queue"], row["steps"] = {}, {}, {}
            handoffs = 0.0
            for where in after:  # each model's numbers come from its own server
                row["peer_send"].update(prometheus.histogram_delta(before[where], after[where], PEER_HISTOGRAM))
                row["triton_queue"].update(prometheus.triton_queue_delta(before[where], after[where]))
                busy = prometheus.counter_delta(before[where], after[where], BUSY_COUNTER)
                for model, batches in prometheus.histogram_delta(before[where], after[where], BATCH_HISTOGRAM).items():
                    row["steps"][model] = step_stats(batches["count"], batches["count"] * batches["mean_s"],
                                                     busy.get(model, 0.0))
                moved = prometheus.counter_delta(before[where], after[where], HANDOFFS, direction="out")
                handoffs += sum(moved.values())
            row["handoffs_per_token"] = handoffs / tokens
            # what the writer's rounds did: output tokens per streamed response, as the client saw them
            row["tokens_per_response"] = tokens / max(1, sum(len(r.arrivals) for r in result.records))
        return row

    rows = side_by_side(list(systems), reps, run, label=f"{' vs '.join(systems)} N={clients}")
    medians = {system: {**median_row(runs), **_cpu_medians(runs)} for system, runs in rows.items()}
    comparisons = [*COMPARISONS, *delay_comparisons([peer_delay_ms(system) for system in placed])]
    return {"clients": clients, "runs": rows, "medians": medians,
            "comparisons": {c.name: _compare(c, rows, medians) for c in comparisons
                            if c.numerator in rows and c.denominator in rows}}


def _compare(c: Comparison, rows: dict[str, list[dict[str, Any]]], medians: dict[str, Any]) -> dict[str, Any]:
    """Ratios of runs of the same repetition (neighbours in time), then their median."""
    pairs = list(zip(rows[c.numerator], rows[c.denominator]))
    ratios = [a["throughput"] / b["throughput"] for a, b in pairs if b["throughput"]]
    ttfts = [a["ttft_median_s"] / b["ttft_median_s"] for a, b in pairs if a["ttft_median_s"] and b["ttft_median_s"]]
    numerator, denominator = (medians[system]["cpu_ms_per_token"] for system in (c.numerator, c.denominator))
    cpu = numerator["server"] if c.added_by is None else numerator["server by process"][c.added_by]
    throughput, ttft = statistics.median(ratios), statistics.median(ttfts) if ttfts else None
    # what each handoff message costs more, both servers' CPU together (two servers vs one)
    per_handoff = [1e3 * (a["cpu_ms_per_token"]["server"] - b["cpu_ms_per_token"]["server"]) / a["handoffs_per_token"]
                   for a, b in pairs if a.get("handoffs_per_token")]
    return {"throughput": {"per_rep": ratios, "median": throughput, "target": c.throughput,
                           "verdict": "-" if c.throughput is None else verdict(throughput, c.throughput)},
            "ttft": {"per_rep": ttfts, "median": ttft, "target": c.ttft,
                     "verdict": "-" if ttft is None or c.ttft is None else ("met" if ttft <= c.ttft else "not met")},
            "server_cpu": {"median_ms": cpu, "of": c.added_by or "server", "target_ms": c.cpu_ms,
                           "verdict": "-" if c.cpu_ms is None else "met" if cpu <= c.cpu_ms else "not met",
                           "total_difference_ms": numerator["server"] - denominator["server"],
                           "difference_per_handoff_us": {"per_rep": per_handoff,
                                                         "median": statistics.median(per_handoff) if per_handoff
                                                         else None}}}


def _cpu_medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    processes = sorted({p for r in runs for p in r["cpu_ms_per_token"]["server by process"]})
    return {"cpu_ms_per_token": {
        "this process": median_of(r["cpu_ms_per_token"]["this process"] for r in runs),
        "server": median_of(r["cpu_ms_per_token"]["server"] for r in runs),
        "server by process": {p: median_of(r["cpu_ms_per_token"]["server by process"].get(p) for r in runs)
                              for p in processes}}}


def markdown(result: dict[str, Any]) -> str:
    points = result["points"]
    models = sorted({model for p in points for m in p["medians"].values() for model in m["busy"]})
    rows = [[p["clients"], system, m["throughput"], ", ".join(fmt(x) for x in m["throughput_all"]),
             ms(m["ttft_median_s"]), ms(m["latency_median_s"]), pct(m["large_share"]),
             *[pct(m["busy"].get(model)) for model in models],
             m["cpu_ms_per_token"]["this process"], m["cpu_ms_per_token"]["server"]]
            for p in points for system, m in p["medians"].items()]
    parts = [table(["N", "path", "tokens/s (median)", "per repetition", "TTFT p50 ms", "latency ms", "large share",
                    *[f"{model} busy" for model in models],
                    "CPU ms/token, this process", "CPU ms/token, server"], rows),
             table(["N", "comparison", "throughput ratio", "per repetition", "verdict", "TTFT ratio", "verdict",
                    "server CPU ms/token", "verdict", "servers' total CPU difference ms/token",
                    "difference per handoff message µs"],
                   [[p["clients"], name, c["throughput"]["median"],
                     ", ".join(fmt(x) for x in c["throughput"]["per_rep"]),
                     f"{c['throughput']['verdict']} (>= {c['throughput']['target']})", c["ttft"]["median"],
                     f"{c['ttft']['verdict']} (<= {c['ttft']['target']})",
                     f"{fmt(c['server_cpu']['median_ms'])} ({c['server_cpu']['of']})",
                     f"{c['server_cpu']['verdict']} (<= {c['server_cpu']['target_ms']})",
                     c["server_cpu"]["total_difference_ms"], c["server_cpu"]["difference_per_handoff_us"]["median"]]
                    for p in points for name, c in p["comparisons"].items()])]
    served = [system for system in result["systems"] if system != "embedded"]
    queued = sorted({model for p in points for s in served for run in p["runs"][s] for model in run["triton_queue"]})
    rows = [[p["clients"], s, median_of(r["tokens_per_response"] for r in p["runs"][s]),
             *[median_of(r["triton_queue"].get(model, {}).get(key) for r in p["runs"][s])
               for model in queued for key in ("requests", "queue_ms")]] for p in points for s in served]
    parts.append(table(["N", "path", "tokens per response", *[f"{model}: {what}" for model in queued
                                                              for what in ("requests", "queue ms")]], rows))
    processes = sorted({name for p in points for s in served
                        for name in p["medians"][s]["cpu_ms_per_token"]["server by process"]})
    parts.append(table(["N", "path", *[f"CPU ms/token, {name}" for name in processes]],
                       [[p["clients"], s, *[p["medians"][s]["cpu_ms_per_token"]["server by process"].get(name)
                                            for name in processes]] for p in points for s in served]))
    stepped = [(p["clients"], s, model, [run["steps"][model] for run in runs if model in run.get("steps", {})])
               for p in points for s, runs in p["runs"].items()
               for model in sorted({m for run in runs for m in run.get("steps", {})})]
    if stepped:
        parts.append(table(["N", "path", "model", "engine steps per run", "rows per step", "ms per step"],
                           [[n, s, model, *[median_of(step[key] for step in steps)
                                            for key in ("steps", "rows_per_step", "ms_per_step")]]
                            for n, s, model, steps in stepped]))
    peers = [(p["clients"], s, model, [run["peer_send"][model] for run in p["runs"][s] if model in run["peer_send"]])
             for p in points for s in served if s != "openai"
             for model in sorted({m for run in p["runs"][s] for m in run["peer_send"]})]
    if peers:
        parts.append(table(["N", "path", "sending model", "peer calls per run (median)", "mean ms (median)",
                            "handoff messages per output token"],
                           [[n, s, model, median_of(h["count"] for h in hs), ms(median_of(h["mean_s"] for h in hs)),
                             median_of(r["handoffs_per_token"] for r in next(p for p in points if p["clients"] == n)
                                       ["runs"][s])] for n, s, model, hs in peers]))
    return "\n\n".join(parts)

