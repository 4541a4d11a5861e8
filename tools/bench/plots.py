"""matplotlib figures of the suites' results, written as PNG (docs/benchmarks/ holds the committed ones)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on a server

import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

from .report import fmt  # noqa: E402


def _save(fig: Any, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _nan(value: float | None) -> float:
    return float("nan") if value is None else value


def plot_validate(result: dict[str, Any], path: Path) -> Path:
    """Predicted at the nominal rate (line), at the realized rate (x) and measured (dots) over B_1."""
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for n in sorted({c["N"] for c in result["cells"]}):
        cells = sorted((c for c in result["cells"] if c["N"] == n), key=lambda c: c["B1"])
        line, = ax.plot([c["B1"] for c in cells], [c["predicted"] for c in cells], "-", label=f"N = {n}")
        ax.plot([c["B1"] for c in cells], [c["predicted_at_realized"] for c in cells], "x", color=line.get_color())
        ax.plot([c["B1"] for c in cells], [c["measured"] for c in cells], "o", color=line.get_color())
    ax.set_xlabel("B_1 (large-model batch threshold), B_0 = 1")
    ax.set_ylabel("tokens/s")
    ax.set_title("Throughput model (line: p = 0.35, x: realized p) vs measured (dots)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(ncol=2, fontsize=8)
    return _save(fig, path)


def plot_compare(result: dict[str, Any], path: Path) -> Path:
    """Median throughput per system, with the spread over repetitions."""
    medians = result["medians"]
    systems = list(medians)
    values = [medians[s]["throughput"] for s in systems]
    low = [v - min(medians[s]["throughput_all"]) for s, v in zip(systems, values)]
    high = [max(medians[s]["throughput_all"]) - v for s, v in zip(systems, values)]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    bars = ax.bar(systems, values, yerr=[low, high], capsize=3,
                  color=["tab:orange" if s == "tokenrouter" else "tab:blue" for s in systems])
    ax.bar_label(bars, labels=[fmt(v) for v in values], fontsize=8, padding=2)
    ax.set_ylabel("tokens/s")
    ax.set_title(f"{result['setup']['kind']}: N = {result['clients']}, {result['workload']['kind']}, "
                 f"median of {result['reps']}")
    ax.tick_params(axis="x", rotation=30)
    return _save(fig, path)


def plot_sweep(result: dict[str, Any], path: Path) -> Path:
    """Throughput (top) and per-user speed (bottom) over concurrency, one column per workload."""
    workloads = result["workloads"]
    fig, axes = plt.subplots(2, len(workloads), figsize=(4.6 * len(workloads), 7), squeeze=False)
    for col, kind in enumerate(workloads):
        for system in result["systems"]:
            points = sorted((p for p in result["points"] if p["workload"] == kind and p["system"] == system),
                            key=lambda p: p["clients"])
            xs = [p["clients"] for p in points]
            style = {"linewidth": 2.5} if system == "tokenrouter" else {}
            for row, key in enumerate(("throughput", "per_user_median_tok_s")):
                axes[row][col].plot(xs, [_nan(p[key]) for p in points], "o-", label=system, **style)
        axes[0][col].set_title(f"{result['setup']['kind']}: {kind}")
        axes[0][col].set_ylabel("tokens/s")
        axes[1][col].set_ylabel("per-user tokens/s")
        for ax in (axes[0][col], axes[1][col]):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrency N")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    return _save(fig, path)


def plot_served(result: dict[str, Any], path: Path) -> Path:
    """Served vs embedded over concurrency: throughput (with the spread over repetitions), TTFT p50,
    and CPU per output token (served: the server's processes; embedded: the benchmark process)."""
    points = result["points"]
    xs = [p["clients"] for p in points]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for system, style in (("embedded", "o-"), ("served", "s-"), ("openai", "^-"), ("dynamo", "v-")):
        if system not in result.get("systems", ("embedded", "served")):
            continue
        medians = [p["medians"][system] for p in points]
        values = [m["throughput"] for m in medians]
        axes[0].errorbar(xs, values, fmt=style, capsize=3, label=system,
                         yerr=[[v - min(m["throughput_all"]) for v, m in zip(values, medians)],
                               [max(m["throughput_all"]) - v for v, m in zip(values, medians)]])
        axes[1].plot(xs, [1e3 * _nan(m["ttft_median_s"]) for m in medians], style, label=system)
        where = "this process" if system == "embedded" else "server"
        axes[2].plot(xs, [_nan(m["cpu_ms_per_token"][where]) for m in medians], style,
                     label=f"{system} ({where})")
    axes[2].axhline(0.5, color="grey", linestyle=":", label="target (server)")
    for ax, label in zip(axes, ("tokens/s", "TTFT p50 ms", "CPU ms per output token")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("closed-loop clients N")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{' vs '.join(result.get('systems', ('embedded', 'served')))}, median of {result['reps']}",
                 fontsize=10)
    return _save(fig, path)


def plot_fleet(result: dict[str, Any], path: Path) -> Path:
    """Replicas behind Dynamo: throughput and throughput per replica against the replica count."""
    names = list(result["medians"])
    counts = [int(name.split()[0]) for name in names]
    medians = [result["medians"][name] for name in names]
    fig, axes = plt.subplots(1, 2, figsize=(9, 4))
    axes[0].plot(counts, [m["throughput"] for m in medians], "o-", label="measured")
    axes[0].plot(counts, [medians[0]["throughput"] * c / counts[0] for c in counts], ":", color="grey",
                 label="linear")
    axes[1].plot(counts, [result["scaling"][name]["median"] for name in names], "o-", label="measured")
    axes[1].axhline(result["target"], color="grey", linestyle=":", label=f"target {result['target']}")
    for ax, label in zip(axes, ("tokens/s", "per replica / one replica's")):
        ax.set_xticks(counts, [str(c) for c in counts])
        ax.set_xlabel(f"replicas ({result['per_replica_clients']} clients each)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"replicas of the pair behind NVIDIA Dynamo, median of {result['reps']}", fontsize=10)
    return _save(fig, path)


def plot_pool_splits(result: dict[str, Any], path: Path) -> Path:
    """Pairs and every pool split of a worker budget: measured tokens/s (median, each repetition) beside
    the throughput model's prediction, one panel per routing rate."""
    rates = list(result["results"])
    fig, axes = plt.subplots(1, len(rates), figsize=(5 * len(rates), 4), squeeze=False)
    for ax, rate in zip(axes[0], rates):
        rows = result["results"][rate]
        x = range(len(rows))
        ax.bar([i - 0.2 for i in x], [r["median"]["throughput"] for r in rows.values()], 0.4, label="measured")
        ax.bar([i + 0.2 for i in x], [r["predicted"] for r in rows.values()], 0.4, label="predicted", alpha=0.6)
        for i, row in enumerate(rows.values()):
            ax.plot([i - 0.2] * len(row["runs"]), [r["throughput"] for r in row["runs"]], "k.", markersize=3)
        ax.set_xticks(list(x), list(rows), fontsize=8)
        ax.set_title(f"p = {rate}, N = {result['clients']}", fontsize=9)
        ax.set_ylabel("tokens/s")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    fig.suptitle(f"{result['budget']} workers: pairs vs small + large pools behind NVIDIA Dynamo "
                 f"(median of {result['reps']})", fontsize=10)
    return _save(fig, path)


def plot_vllm_serving(result: dict[str, Any], path: Path) -> Path:
    """`bench-vllm serving`: throughput, TTFT and per-user speed over N, one line per system."""
    keys = (("throughput", "tokens/s", 1), ("ttft_median_s", "TTFT ms (median)", 1e3),
            ("per_user_median_tok_s", "per-user tokens/s", 1))
    fig, axes = plt.subplots(1, len(keys), figsize=(13, 3.8))
    for system in result["systems"]:
        points = sorted((p for p in result["points"] if p["system"] == system), key=lambda p: p["clients"])
        for ax, (key, label, scale) in zip(axes, keys):
            ax.plot([p["clients"] for p in points], [_nan(p[key]) * scale for p in points], "o-", label=system)
            ax.set_ylabel(label)
    for ax in axes:
        ax.set_xlabel("concurrency N")
        ax.set_xticks(result["clients"])
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return _save(fig, path)
