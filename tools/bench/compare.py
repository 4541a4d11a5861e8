"""Side by side: every system in every repetition, on the same engines, in the same minutes.

The order of systems alternates between repetitions so that load drift on a shared machine hits
all of them; a ratio is taken within each repetition, then its median is reported.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from tqdm import tqdm

from .report import fmt, ms, pct, table, verdict
from .runner import Timing, measure, median_row
from .setups import LARGE, SMALL
from .systems import SystemFactory
from .workloads import Workload


@dataclass(frozen=True)
class RatioTarget:
    numerator: str
    denominator: str
    target: float
    source: str


# The targets, per pair setup.
TARGETS: dict[str, list[RatioTarget]] = {
    "sim": [RatioTarget("tokenrouter", "std_serving", 3.0, "TokenRouter vs Std. Serving"),
            RatioTarget("tokenrouter", "eager_async", 1.25, "TokenRouter vs Eager-Async")],
    "real": [RatioTarget("tokenrouter", "llm_only", 1.0, "~10 % routed beats LLM-only")],
}
BUSY_TARGET = 0.9  # the large model's busy fraction when it is the bottleneck


def side_by_side(systems: Sequence[str], reps: int, run: Callable[[str, int], dict[str, Any]], *,
                 label: str = "") -> dict[str, list[dict[str, Any]]]:
    """``run(system, rep)`` for every system in every repetition, order reversed on odd ones."""
    plan = [(rep, system) for rep in range(reps) for system in (systems if rep % 2 == 0 else systems[::-1])]
    rows: dict[str, list[dict[str, Any]]] = {system: [] for system in systems}
    with tqdm(plan, desc=label or "bench", unit="run", leave=False) as bar:
        for rep, system in bar:
            bar.set_postfix_str(f"{system} rep {rep + 1}/{reps}")
            row = run(system, rep)
            rows[system].append({**row, "rep": rep})
    return rows


def ratio(rows: dict[str, list[dict[str, Any]]], numerator: str, denominator: str) -> dict[str, Any]:
    """Throughput ratio per repetition (same minute) and its median."""
    per_rep = [a["throughput"] / b["throughput"] for a, b in zip(rows[numerator], rows[denominator])
               if b["throughput"] > 0]
    return {"numerator": numerator, "denominator": denominator, "per_rep": per_rep,
            "median": statistics.median(per_rep) if per_rep else None}


def run_compare(factory: SystemFactory, systems: Sequence[str], clients: int, workload: Workload, timing: Timing, *,
                reps: int, seed: int = 0) -> dict[str, Any]:
    rows = side_by_side(systems, reps, lambda system, rep: measure(factory, system, clients, workload, timing,
                                                                      seed=seed + rep),
                        label=f"{factory.setup.kind} N={clients} {workload.kind}")
    medians = {system: median_row(runs) for system, runs in rows.items()}
    ratios = [ratio(rows, "tokenrouter", other) for other in systems if other != "tokenrouter"] \
        if "tokenrouter" in systems else []
    checks = [{"what": t.source, "ratio": f"{t.numerator} / {t.denominator}", "target": t.target,
               "measured": ratio(rows, t.numerator, t.denominator)["median"]}
              for t in TARGETS.get(factory.setup.kind, []) if t.numerator in rows and t.denominator in rows]
    for check in checks:
        check["verdict"] = verdict(check["measured"], check["target"]) if check["measured"] is not None else "-"
    return {"suite": "compare", "setup": factory.setup.describe(), "clients": clients, "workload": workload.__dict__,
            "timing": timing.__dict__, "reps": reps, "runs": rows, "medians": medians, "ratios": ratios,
            "checks": checks, "busy_checks": busy_checks(medians)}


def busy_checks(medians: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The large model's busy fraction in every run where it was the busiest model."""
    out = []
    for system, row in medians.items():
        busy = row["busy"]
        if busy.get(LARGE) is not None and busy[LARGE] >= (busy.get(SMALL) or 0.0):
            out.append({"system": system, "busy": busy[LARGE], "target": BUSY_TARGET,
                        "verdict": verdict(busy[LARGE], BUSY_TARGET)})
    return out


def std_serving_table(runs: list[dict[str, Any]]) -> str:
    """What each plain server did per step (every repetition)."""
    rows = [[run["rep"], model, s["steps"], s["mean_batch"], s["step_ms"], s["bookkeeping_ms_per_step"],
             f"{s['hits']} / {s['lookups']}", s["evictions"]]
            for run in runs for model, s in run["std_serving"].items()]
    return table(["Std. Serving rep", "model", "steps", "rows per step", "engine ms per step",
                  "bookkeeping ms per step", "prefix hits / calls", "evictions"], rows)


def markdown(result: dict[str, Any]) -> str:
    medians = result["medians"]
    rows = [[system, m["throughput"], ms(m["ttft_median_s"]), ms(m["latency_median_s"]), m["per_user_median_tok_s"],
             pct(m["large_share"]), pct(m["busy"].get(SMALL)), pct(m["busy"].get(LARGE))]
            for system, m in medians.items()]
    parts = [table(["system", "tokens/s", "TTFT ms", "latency ms", "per-user tok/s", "large share", "busy slm",
                    "busy llm"], rows)]
    if "std_serving" in result["runs"]:
        parts.append(std_serving_table(result["runs"]["std_serving"]))
    if result["ratios"]:
        parts.append(table(["ratio", "median", "per repetition"],
                           [[f"{r['numerator']} / {r['denominator']}", r["median"],
                             ", ".join(fmt(x) for x in r["per_rep"])] for r in result["ratios"]]))
    if result["checks"]:
        parts.append(table(["target", "ratio", "target", "measured", "verdict"],
                           [[c["what"], c["ratio"], f">= {c['target']}", c["measured"], c["verdict"]]
                            for c in result["checks"]]))
    if result["busy_checks"]:
        parts.append(table(["system (large model busiest)", "large model busy", "target", "verdict"],
                           [[c["system"], pct(c["busy"]), f">= {pct(c['target'])}", c["verdict"]]
                            for c in result["busy_checks"]]))
    return "\n\n".join(parts)
