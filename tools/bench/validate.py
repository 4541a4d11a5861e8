"""Model validation: the throughput model's prediction vs the runtime's measured throughput.

The paper's R2R example on the simulated A100 pair: random routing with p = 0.35 small -> large,
the large model hands back after one token (c = [[1, 0], [1, 0]]), B_0 = 1 and B_1 swept 1..N for
N = 2..8 closed-loop clients. By default the simulated steps cost exactly the profile's latency per
batch size (the per-token prefill cost is zeroed); with ``prefill_cost`` they also cost the
profile's per-token price of every prefill and extend, and the model charges those too
(``tokenrouter.throughput.prefill``, from the workload's prompt and output lengths). Requests never
end early (no eos), and the starvation guard (max_wait) is far above any wait the chain produces,
so the model's inputs are the system's. Each cell also keeps the decode-only prediction (what the
model predicted before it charged prefills) and, with ``monte_carlo``, the discrete-event
simulation of the same inputs.

The random policy decides per (request seed, position), so a short run's realized routing rate
differs from p by sampling noise; with c = [[1, 0], [1, 0]] that rate is exactly the large model's
token share. Each cell is therefore also predicted at its realized rate, and the error is taken
against that (the model's input is the rate the system saw); the nominal prediction is kept too.
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

from tokenrouter.engine.sim_profile import resolve_profile
from tokenrouter.throughput import predict
from tokenrouter.throughput.montecarlo import simulate
from tokenrouter.throughput.prefill import PrefillCosts

from .compare import side_by_side
from .report import fmt, table
from .runner import Timing, measure
from .setups import LARGE, SMALL, Setup, sim_setup
from .systems import SystemFactory
from .thresholds import random_routing, step_latencies
from .workloads import Workload

TOLERANCE = 0.10  # predicted within 10 % of measured
DELTA_S = 1e-4  # the paper's grid; the profile latencies are multiples of it
# Run next to every N: the small model alone, whose throughput is known exactly (N / L_0(N)). Its
# error is what the runtime itself costs on this machine at that moment, with no routing at all.
CONTROL = "slm_only"


def sweep_thresholds(n: int, b1: int) -> list[list[int]]:
    """B_0 = 1 and B_1 = b1 at N = n, as per-N lists that never deadlock while N ramps up."""
    return [[1] * n, [min(b1, k) for k in range(1, n + 1)]]


def prefill_costs(setup: Setup, workload: Workload) -> PrefillCosts:
    """The model's prefill charges for the simulated pair: each profile's price per fed token."""
    if workload.kind == "multi-turn":
        raise ValueError("the model's prefill charges take independent prompts: validate short-long or long-short")
    per_token = tuple(resolve_profile(setup.models[name]["profile"]).per_token_ms / 1e3 for name in (SMALL, LARGE))
    return PrefillCosts(per_token, workload.prompt_tokens, workload.max_tokens)


def run_validate(populations: Sequence[int], timing: Timing, *, reps: int, seed: int = 0,
                 max_tokens: int | None = None, time_scale: float = 1.0, workload_kind: str = "short-long",
                 prefill_cost: bool = False, monte_carlo: int = 0) -> dict[str, Any]:
    """``time_scale`` > 1 runs the simulated clock slower (every sleep that much longer, windows
    too) and converts throughput back: the runtime's own per-step cost then weighs less.
    ``monte_carlo``: batch completions of the discrete-event simulation per cell (0: none)."""
    setup = sim_setup(prefill_cost=prefill_cost, eos=False, time_scale=time_scale)
    timing = Timing(timing.warmup_s * time_scale, timing.measure_s * time_scale)
    engines = setup.open_engines()
    factory = SystemFactory(setup, engines, None)
    workload = setup.with_workload(workload_kind, max_tokens)
    costs = prefill_costs(setup, workload) if prefill_cost else None
    latencies = {name: step_latencies(engines[name], max(populations)) for name in (SMALL, LARGE)}
    P, C = random_routing(setup.rate)
    cells, overhead = [], []
    for n in populations:
        labels = {f"B1={b1}": b1 for b1 in range(1, n + 1)}
        rows = side_by_side([*labels, CONTROL], reps, lambda label, rep: measure(
            factory, CONTROL, n, workload, timing, seed=seed + rep) if label == CONTROL else measure(
            factory, "tokenrouter", n, workload, timing, seed=seed + rep,
            thresholds=sweep_thresholds(n, labels[label])), label=f"validate N={n}")
        L = [latencies[SMALL][:n], latencies[LARGE][:n]]
        control = statistics.median(r["throughput"] for r in rows[CONTROL]) * time_scale
        overhead.append({"N": n, "exact": (exact := control_throughput(L[0], n, costs)), "measured": control,
                         "error": control / exact - 1})
        for label, b1 in labels.items():
            realized = statistics.median(r["large_share"] for r in rows[label])
            at_realized = predict(*random_routing(realized), L, [1, b1], n, DELTA_S, snap=True, prefill=costs)
            measured = statistics.median(r["throughput"] for r in rows[label]) * time_scale
            cell = {"N": n, "B1": b1, "predicted": predict(P, C, L, [1, b1], n, DELTA_S, snap=True, prefill=costs),
                    "realized_rate": realized, "predicted_at_realized": at_realized, "measured": measured,
                    "error": measured / at_realized - 1,
                    "measured_all": [r["throughput"] * time_scale for r in rows[label]],
                    "busy": {m: statistics.median(r["busy"][m] for r in rows[label]) for m in (SMALL, LARGE)}}
            if costs is not None:
                cell["decode_only_at_realized"] = predict(*random_routing(realized), L, [1, b1], n, DELTA_S, snap=True)
            if monte_carlo:
                cell["simulated_at_realized"] = simulate(*random_routing(realized), L, [1, b1], n, events=monte_carlo,
                                                         prefill=costs)
            cells.append(cell)
    return {"suite": "validate", "setup": setup.describe(), "workload": workload.__dict__, "timing": timing.__dict__,
            "reps": reps, "time_scale": time_scale, "prefill": costs.__dict__ if costs else None,
            "latencies_ms": {k: [x * 1e3 for x in v] for k, v in latencies.items()},
            "routing": {"P": P, "C": C}, "cells": cells, "best": best_by_n(cells), "control": overhead,
            "within_tolerance": sum(abs(c["error"]) <= TOLERANCE for c in cells), "tolerance": TOLERANCE}


def control_throughput(L0: list[float], n: int, costs: PrefillCosts | None) -> float:
    """The small model alone: always a batch of n, n tokens per step; with prefill charges, the
    discrete-event simulation of it (a one-model system, no routing)."""
    if costs is None:
        return n / L0[n - 1]
    alone = PrefillCosts(costs.per_token_s[:1], costs.prompt_tokens, costs.output_tokens)
    return simulate([[1.0]], [[1.0]], [L0], [1], n, events=20_000, prefill=alone)


def best_by_n(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per N: the predicted and the measured argmax of B_1, and what the predicted best measured."""
    out = []
    for n in sorted({c["N"] for c in cells}):
        row = [c for c in cells if c["N"] == n]
        predicted = max(row, key=lambda c: c["predicted"])
        measured = max(row, key=lambda c: c["measured"])
        out.append({"N": n, "predicted_B1": predicted["B1"], "measured_B1": measured["B1"],
                    "match": predicted["B1"] == measured["B1"],
                    # how far the predicted choice fell short of the best measured one
                    "shortfall": 1 - predicted["measured"] / measured["measured"]})
    return out


def charges_table(cells: list[dict[str, Any]]) -> str:
    """Before and after the prefill charges: each prediction at the realized rate against the measurement."""
    def vs(predicted: float | None, measured: float) -> str:
        return "-" if predicted is None else f"{predicted:.1f} ({100 * (measured / predicted - 1):+.1f} %)"
    return "\n".join(["decode-only chain (before) / chain with prefill charges / simulation with them: "
                      "prediction (error of measured vs it)",
                      table(["N", "B1", "measured", "decode-only chain", "chain + prefill", "simulation + prefill"],
                            [[c["N"], c["B1"], f"{c['measured']:.1f}", vs(c["decode_only_at_realized"], c["measured"]),
                              vs(c["predicted_at_realized"], c["measured"]),
                              vs(c.get("simulated_at_realized"), c["measured"])] for c in cells])])


def markdown(result: dict[str, Any]) -> str:
    cells = result["cells"]
    top = max(c["N"] for c in cells)
    headers = ["N"] + [f"B1={b}" for b in range(1, top + 1)]
    rows = []
    for n in sorted({c["N"] for c in cells}):
        by_b = {c["B1"]: c for c in cells if c["N"] == n}
        rows.append([n] + [f"{by_b[b]['predicted_at_realized']:.1f} / {by_b[b]['measured']:.1f} "
                           f"({100 * by_b[b]['error']:+.1f} %)" if b in by_b else "" for b in range(1, top + 1)])
    best = result["best"]
    matches = sum(b["match"] for b in best)
    charges = [charges_table(cells)] if "decode_only_at_realized" in cells[0] else []
    summary = table(["N", "predicted B1*", "measured B1*", "match", "throughput lost by the predicted B1*"],
                    [[b["N"], b["predicted_B1"], b["measured_B1"], "yes" if b["match"] else "no",
                      f"{100 * b['shortfall']:.1f} %"] for b in best])
    errors = [abs(c["error"]) for c in cells]
    return "\n\n".join([
        "predicted at the realized routing rate / measured tokens/s (error of measured vs predicted)",
        table(headers, rows),
        *charges,
        f"cells within {100 * result['tolerance']:.0f} %: {result['within_tolerance']} of {len(cells)}; "
        f"largest error {100 * max(errors):.1f} %, mean {100 * statistics.mean(errors):.1f} %",
        summary,
        f"argmax B1 matches in {matches} of {len(best)} N (predicted B1* at the nominal p = "
        f"{result['routing']['P'][0][1]})",
        "control (no routing, exact N / L_0(N)) vs measured: " + ", ".join(
            f"N={c['N']}: {c['exact']:.0f} / {c['measured']:.0f} ({100 * c['error']:+.1f} %)"
            for c in result["control"]),
        "realized routing rates: " + ", ".join(f"N={c['N']} B1={c['B1']}: {c['realized_rate']:.3f}" for c in cells),
        "latencies (ms per step by batch size 1..): "
        + "; ".join(f"{k}: {', '.join(fmt(x) for x in v)}" for k, v in result["latencies_ms"].items()),
    ])
