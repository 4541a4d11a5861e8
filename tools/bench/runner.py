"""One measured run: open a system, drive it with closed-loop clients, summarize, close it."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Iterable

from .loadgen import LoadResult, run_closed_loop
from .records import summarize
from .setups import LARGE
from .stdserving import StdServingTarget
from .systems import SystemFactory, is_lockstep
from .targets import Target
from .workloads import PromptSource, Workload

SUMMARY_KEYS = ("throughput", "ttft_median_s", "latency_median_s", "per_user_median_tok_s", "large_share")


@dataclass(frozen=True)
class Timing:
    warmup_s: float
    measure_s: float


def closed_loop(target: Target, workload: Workload, source: PromptSource, *, clients: int, timing: Timing,
                seed: int = 0, lockstep: bool = False) -> LoadResult:
    """One closed-loop run on ``target``, closed after it."""
    try:
        return run_closed_loop(target, workload, source, clients=clients, warmup_s=timing.warmup_s,
                               measure_s=timing.measure_s, seed=seed, lockstep=lockstep)
    finally:
        target.close()


def measure(factory: SystemFactory, system: str, clients: int, workload: Workload, timing: Timing, *,
            seed: int = 0, thresholds: list[list[int]] | None = None) -> dict[str, Any]:
    """The summary of one run as a flat dict (plus what the system itself counted)."""
    target = factory.open(system, clients, thresholds)
    result = closed_loop(target, workload, factory.setup.source(), clients=clients, timing=timing, seed=seed,
                         lockstep=is_lockstep(system))
    summary = summarize(result.records, result.window, clients, large=LARGE, steps=result.spans)
    row: dict[str, Any] = {"system": system, "workload": workload.kind, **summary.as_dict()}
    if isinstance(target, StdServingTarget):
        row["std_serving"] = {name: server.report() for name, server in target.servers.items()}
    if thresholds is not None or system == "tokenrouter":
        row["thresholds"] = thresholds or factory.thresholds(clients)
    return row


def median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over repetitions of the summary numbers (busy fractions per model too)."""
    out: dict[str, Any] = {key: median_of(row[key] for row in rows) for key in SUMMARY_KEYS}
    out["busy"] = {model: median_of(row["busy"].get(model) for row in rows) for model in rows[0]["busy"]}
    out["throughput_all"] = [row["throughput"] for row in rows]
    return out


def median_of(values: Iterable[float | None]) -> float | None:
    """The median of the values that are present (None when none is)."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None
