"""Replicas of the pair behind NVIDIA Dynamo, as benchmark targets: a `tokenrouter fleet` started for
a config and kept up for a whole comparison, and the replica-scaling suite (throughput per replica
with 1, 2, 4 replicas at the same clients per replica, every fleet up at once and run in turn).

The fleet is called like the OpenAI server (streamed /v1/completions, continuous usage), asking for
``engine_data`` so that each response's ``large_model_share`` comes back.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Sequence

import yaml

from tokenrouter.config import TokenRouterConfig
from tokenrouter.fleet.launcher import parse_pools
from tokenrouter.launch.free_ports import free_port, free_port_run
from tokenrouter.procfs import proc_stat

from .compare import side_by_side
from .cpu import group_cpu_by_process
from .openai_target import OpenAITarget
from .records import summarize
from .report import fmt, ms, table
from .runner import Timing, closed_loop, median_row
from .workloads import TextPrompts, Workload

ENGINE_DATA = {"nvext": {"extra_fields": ["engine_data"]}}
FRONTEND = "dynamo frontend"
REPLICA_COUNTS = (1, 2, 4)


class Fleet:
    """`tokenrouter fleet --config C --replicas R` (or ``--pools M+K``) on loopback, in a folder of its own."""

    def __init__(self, config: TokenRouterConfig, replicas: int, folder: Path, pools: str | None = None) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        config_path = folder / "config.yaml"
        config_path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
        self.folder, self.replicas, self.pools, self.http_port = folder, replicas, pools, free_port()
        self.status_base = free_port_run(replicas)
        layout = ["--pools", pools] if pools else ["--replicas", str(replicas),
                                                   "--worker-status-port", str(self.status_base)]
        self.command = [sys.executable, "-m", "tokenrouter.launch.cli", "fleet", "--config", str(config_path),
                        *layout, "--http-port", str(self.http_port), "--run-dir", str(folder), "--drain-timeout", "10"]
        self.process: subprocess.Popen | None = None
        self.url = f"http://127.0.0.1:{self.http_port}/v1"

    def start(self, timeout_s: float = 600.0) -> "Fleet":
        self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL,
                                        stderr=(self.folder / "launcher.log").open("wb"))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tokenrouter fleet exited; logs in {self.folder}")
            if self._workers_ready() and _ok(f"{self.url}/models", b'"tokenrouter"'):
                return self
            time.sleep(1.0)
        raise TimeoutError(f"the fleet of {self.replicas} was not ready in {timeout_s} s; logs in {self.folder}")

    def _workers_ready(self) -> bool:
        """Replicas: each worker's /health. Pools: each worker's log names every instance of the other
        model it linked (an entry serves once one peer instance is linked; the others follow)."""
        if self.pools is None:
            return all(_ok(f"http://127.0.0.1:{self.status_base + i}/health") for i in range(self.replicas))
        entries, peers = parse_pools(self.pools)
        peer_model = self._peer_model()
        logs = [(self.folder / f"entry-{m}.log", peers) for m in range(entries)] + \
               [(self.folder / f"peer-{peer_model}-{k}.log", entries) for k in range(peers)]
        return all(log.exists() and _linked(log.read_text(errors="replace")) >= count for log, count in logs)

    def _peer_model(self) -> str:
        config = yaml.safe_load((self.folder / "config.yaml").read_text())
        return next(name for name in config["models"] if name != config["entry"])

    def target(self, large: str) -> OpenAITarget:
        return OpenAITarget(self.url, large, extra_body=ENGINE_DATA)

    def cpu_seconds(self) -> dict[str, float]:
        """The frontend's and each worker's CPU seconds (each runs in a process group of its own)."""
        if self.process is None:
            raise RuntimeError(f"the fleet in {self.folder} has not been started: no CPU seconds to read")
        seconds: dict[str, float] = {}
        for pid in _children(self.process.pid):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            name = FRONTEND if b"dynamo.frontend" in cmdline else f"worker {pid}"
            seconds[name] = sum(group_cpu_by_process(pid).values())
        return seconds

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()


def run_replicas(config: TokenRouterConfig, per_replica: int, workload: Workload, timing: Timing, *, reps: int,
                 seed: int = 0, counts: Sequence[int] = REPLICA_COUNTS) -> dict[str, Any]:
    """Throughput of each fleet at ``per_replica`` x replicas clients, runs alternated, and each one's
    throughput per replica against one replica's (target: at least 0.9)."""
    large = next(name for name in config.model_names if name != config.entry)
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        fleets = {f"{r} replicas": Fleet(config, r, Path(tmp) / f"fleet-{r}") for r in counts}
        try:
            for fleet in fleets.values():
                fleet.start()

            def run(name: str, rep: int) -> dict[str, Any]:
                fleet = fleets[name]
                clients = per_replica * fleet.replicas
                result = closed_loop(fleet.target(large), workload, TextPrompts(), clients=clients, timing=timing,
                                     seed=seed + rep)
                row = summarize(result.records, result.window, clients, large=large, steps=result.spans).as_dict()
                row["per_replica"] = row["throughput"] / fleet.replicas
                return row

            rows = side_by_side(list(fleets), reps, run, label=f"fleets of {', '.join(map(str, counts))}")
        finally:
            for fleet in fleets.values():
                fleet.stop()
    medians = {name: median_row(runs) for name, runs in rows.items()}
    one = f"{counts[0]} replicas"
    scaling = {name: {"per_rep": [a["per_replica"] / b["per_replica"] for a, b in zip(runs, rows[one])]}
               for name, runs in rows.items()}
    for value in scaling.values():
        value["median"] = sorted(value["per_rep"])[len(value["per_rep"]) // 2]
    return {"suite": "fleet", "config": config.model_dump(mode="json"), "per_replica_clients": per_replica,
            "counts": list(counts), "workload": workload.__dict__, "timing": timing.__dict__, "reps": reps,
            "runs": rows, "medians": medians, "scaling": scaling, "target": 0.9}


def markdown(result: dict[str, Any]) -> str:
    rows = [[name, result["per_replica_clients"] * int(name.split()[0]), m["throughput"],
             ", ".join(fmt(r["throughput"]) for r in result["runs"][name]),
             m["throughput"] / int(name.split()[0]), result["scaling"][name]["median"],
             ", ".join(fmt(x) for x in result["scaling"][name]["per_rep"]), ms(m["ttft_median_s"])]
            for name, m in result["medians"].items()]
    return table(["fleet", "clients", "tokens/s (median)", "per repetition", "tokens/s per replica",
                  "per replica / one replica's (median)", "per repetition", "TTFT p50 ms"], rows)


def _linked(log: str) -> int:
    """The instances a pool worker's log says it linked (pool_member.py logs each link that comes up)."""
    return len({line.split(" at ", 1)[1].strip() for line in log.splitlines() if ": linked to " in line})


def _children(pid: int) -> list[int]:
    return [int(p.name) for p in Path("/proc").glob("[0-9]*") if (stat := proc_stat(p.name)) and stat.ppid == pid]


def _ok(url: str, needle: bytes = b"") -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return response.status == 200 and needle in response.read()
    except OSError:
        return False
