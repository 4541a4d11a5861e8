"""Concurrency sweep: every workload x concurrency, the systems side by side at each point."""

from __future__ import annotations

from typing import Any, Sequence

from .compare import side_by_side
from .report import ms, pct, table
from .runner import Timing, measure, median_row
from .setups import LARGE
from .systems import SystemFactory


def run_sweep(factory: SystemFactory, systems: Sequence[str], concurrency: Sequence[int], workloads: Sequence[str],
              timing: Timing, *, reps: int, seed: int = 0, max_tokens: int | None = None) -> dict[str, Any]:
    points = []
    for kind in workloads:
        workload = factory.setup.with_workload(kind, max_tokens)
        for clients in concurrency:
            rows = side_by_side(systems, reps, lambda system, rep: measure(factory, system, clients, workload, timing,
                                                                              seed=seed + rep),
                                label=f"{factory.setup.kind} {kind} N={clients}")
            for system, runs in rows.items():
                points.append({"workload": kind, "clients": clients, "system": system, **median_row(runs),
                               "runs": runs})
    return {"suite": "sweep", "setup": factory.setup.describe(), "timing": timing.__dict__, "reps": reps,
            "systems": list(systems), "concurrency": list(concurrency), "workloads": list(workloads),
            "points": points}


def markdown(result: dict[str, Any]) -> str:
    parts = []
    for kind in result["workloads"]:
        points = [p for p in result["points"] if p["workload"] == kind]
        rows = [[p["clients"], p["system"], p["throughput"], ms(p["ttft_median_s"]), ms(p["latency_median_s"]),
                 p["per_user_median_tok_s"], pct(p["large_share"]), pct(p["busy"].get(LARGE))] for p in points]
        parts.append(f"**{kind}**\n\n" + table(["N", "system", "tokens/s", "TTFT ms", "latency ms", "per-user tok/s",
                                                "large share", "busy llm"], rows))
    return "\n\n".join(parts)
