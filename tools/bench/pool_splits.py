"""Pool splits behind NVIDIA Dynamo, measured beside the throughput model's prediction: a worker budget
as whole pairs (`tokenrouter fleet --replicas budget/2`) and as every split M+K (`--pools M+K`), each at
N closed-loop clients, for each routing rate. One fleet is up at a time (started, measured ``reps``
times, stopped), so the numbers of different layouts come from different minutes: read them with the
load average beside them.

The prediction is ``tokenrouter.throughput.pools.predict_pools`` for the same split, N and routing
(random at ``rate``, back after one token), with the config's simulated step latencies (base and slope
per row of its profiles) and eager thresholds ``B = [1, 1]``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Sequence

from tokenrouter.config import TokenRouterConfig
from tokenrouter.engine.sim_profile import resolve_profile
from tokenrouter.throughput.pools import predict_pools

from .fleet import Fleet
from .records import summarize
from .report import fmt, table
from .runner import Timing, closed_loop, median_row
from .workloads import TextPrompts, Workload


def layouts(budget: int) -> list[str]:
    """Whole pairs first (the reference), then every split M+K of the budget."""
    return [f"{budget // 2} pairs"] + [f"{m}+{budget - m}" for m in range(1, budget)]


def run_pool_splits(config: TokenRouterConfig, clients: int, workload: Workload, timing: Timing, *, reps: int,
                    rates: Sequence[float], budget: int = 6, seed: int = 0, events: int = 40_000) -> dict[str, Any]:
    large = next(name for name in config.model_names if name != config.entry)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-pools-") as tmp:
        for rate in rates:
            policy = config.policy.model_copy(update={"params": {**config.policy.params, "rate": rate}})
            routed = config.model_copy(update={"policy": policy})
            rows: dict[str, Any] = {}
            for layout in layouts(budget):
                pools = None if layout.endswith("pairs") else layout
                fleet = Fleet(routed, budget // 2, Path(tmp) / f"{rate}-{layout.replace(' ', '-')}", pools=pools)
                try:
                    fleet.start()
                    before = fleet.cpu_seconds()
                    runs = []
                    for rep in range(reps):
                        result = closed_loop(fleet.target(large), workload, TextPrompts(), clients=clients,
                                             timing=timing, seed=seed + rep)
                        runs.append({**summarize(result.records, result.window, clients, large=large,
                                                 steps=result.spans).as_dict(), "load": os.getloadavg()[0]})
                    after = fleet.cpu_seconds()
                finally:
                    fleet.stop()
                workers = (budget // 2, budget // 2) if pools is None else tuple(int(n) for n in pools.split("+"))
                rows[layout] = {"runs": runs, "median": median_row(runs),
                                "cpu_s": {name: after[name] - before.get(name, 0.0) for name in after},
                                "predicted": predict_pools(*routing(rate), latencies(config, clients), [1, 1],
                                                           clients, workers, events=events, seed=seed).simulated}
            results[str(rate)] = rows
    return {"suite": "pools", "config": config.model_dump(mode="json"), "clients": clients, "budget": budget,
            "rates": list(rates), "workload": workload.__dict__, "timing": timing.__dict__, "reps": reps,
            "results": results}


def routing(rate: float) -> tuple[list[list[float]], list[list[int]]]:
    """P and C of random routing at ``rate``, back after one token (docs/throughput.md, "The model")."""
    return [[1 - rate, rate], [1.0, 0.0]], [[1, 0], [1, 0]]


def latencies(config: TokenRouterConfig, clients: int) -> list[list[float]]:
    """Each model's decode step in seconds for 1..clients rows, from its simulated profile."""
    steps = []
    for name, spec in config.models.items():
        if spec.profile is None:
            raise ValueError(f"model '{name}' is not simulated: its step latencies are not known here")
        profile = resolve_profile(spec.profile)
        steps.append([(profile.base_ms + profile.per_row_ms * rows) / 1e3 for rows in range(1, clients + 1)])
    return steps


def markdown(result: dict[str, Any]) -> str:
    out = []
    for rate, rows in result["results"].items():
        reference = next(iter(rows.values()))
        lines = [[layout, fmt(row["median"]["throughput"]),
                  ", ".join(fmt(r["throughput"]) for r in row["runs"]),
                  f"{row['median']['throughput'] / reference['median']['throughput'] - 1:+.1%}",
                  fmt(row["predicted"]), f"{row['median']['throughput'] / row['predicted'] - 1:+.1%}",
                  fmt(sum(row["cpu_s"].values())), ", ".join(f"{r['load']:.1f}" for r in row["runs"])]
                 for layout, row in rows.items()]
        out.append(f"p = {rate}, N = {result['clients']}\n\n" + table(
            ["layout", "tokens/s (median)", "per repetition", "vs pairs", "predicted", "measured vs predicted",
             "CPU s (all processes)", "load"], lines))
    return "\n\n".join(out)
