"""Summaries of policy runs: pass@1 with its standard error, the gain ratio against the two
single-model baselines, the target, the JSON file, the markdown table and the frontier plot."""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from .runner import PolicyRun

# The target: at least this share of LLM-only's pass@1 gain over SLM-only ...
TARGET_GAIN_RATIO = 0.8
# ... with at most this share of the output tokens written by the large model.
TARGET_LARGE_SHARE = 0.25
SLM, LLM = "slm_only", "llm_only"


@dataclass
class Summary:
    label: str
    policy: str
    n: int
    passed: int
    pass_at_1: float
    stderr: float
    large_share: float
    tokens_per_s: float
    output_tokens: int
    wall_s: float
    gain_ratio: float | None
    meets_target: bool
    # Paired with SLM-only on the same problems (None without it): problems this setting passes and
    # SLM-only fails, and the reverse. Only these move pass@1 away from SLM-only's.
    gained: int | None
    lost: int | None
    # Exact two-sided McNemar p-value of the difference from SLM-only (its discordant pairs above),
    # and a paired-bootstrap 95 % interval of the gain ratio (problems resampled with their
    # SLM-only and LLM-only outcomes). None without both baselines.
    p_vs_slm: float | None = None
    gain_ci: tuple[float, float] | None = None


def binomial_stderr(p: float, n: int) -> float:
    """Standard error of a pass rate p measured on n problems (one greedy sample each)."""
    return math.sqrt(p * (1.0 - p) / n) if n > 0 else float("nan")


def gain_ratio(pass_policy: float, pass_slm: float, pass_llm: float) -> float | None:
    """(policy - SLM-only) / (LLM-only - SLM-only): how much of the large model's gain the policy
    keeps. None when the large model gains nothing (the ratio has no meaning then)."""
    gain = pass_llm - pass_slm
    if gain <= 0:
        return None
    return (pass_policy - pass_slm) / gain


def mcnemar_exact(gained: int, lost: int) -> float:
    """Two-sided exact McNemar test: the chance, if the setting were no better or worse than the
    baseline, that the discordant problems split at least this unevenly (binomial, p = 1/2)."""
    n = gained + lost
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(gained, lost) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def bootstrap_gain_ci(outcomes: Sequence[tuple[bool, bool, bool]], samples: int = 10_000,
                      seed: int = 0) -> tuple[float, float] | None:
    """95 % percentile interval of the gain ratio over problems resampled with replacement, each
    with its (SLM-only, LLM-only, setting) outcomes; resamples where LLM-only gains nothing are
    left out (the ratio has no meaning there). None when too few resamples remain."""
    rng = random.Random(seed)
    n, ratios = len(outcomes), []
    for _ in range(samples):
        pick = [outcomes[rng.randrange(n)] for _ in range(n)]
        slm, llm, policy = (sum(o[i] for o in pick) for i in range(3))
        if llm > slm:
            ratios.append((policy - slm) / (llm - slm))
    if len(ratios) < samples // 2:
        return None
    ratios.sort()
    return ratios[int(0.025 * len(ratios))], ratios[int(0.975 * len(ratios)) - 1]


def summarize(runs: Sequence[PolicyRun]) -> list[Summary]:
    """One row per run, in order; gain ratios and paired counts need the slm_only and llm_only runs."""
    by_label = {run.label: run for run in runs}
    rates = {label: _pass_rate(run) for label, run in by_label.items()}
    slm_passed = {r.task_id: r.passed for r in by_label[SLM].records} if SLM in by_label else None
    llm_passed = {r.task_id: r.passed for r in by_label[LLM].records} if LLM in by_label else None
    rows = []
    for run in runs:
        p = rates[run.label]
        ratio = gain_ratio(p, rates[SLM], rates[LLM]) if SLM in rates and LLM in rates else None
        meets = ratio is not None and ratio >= TARGET_GAIN_RATIO and run.large_share <= TARGET_LARGE_SHARE
        gained = lost = p_value = interval = None
        if slm_passed is not None:
            gained = sum(r.passed and not slm_passed[r.task_id] for r in run.records)
            lost = sum(slm_passed[r.task_id] and not r.passed for r in run.records)
            p_value = mcnemar_exact(gained, lost)
        if slm_passed is not None and llm_passed is not None:
            interval = bootstrap_gain_ci([(slm_passed[r.task_id], llm_passed[r.task_id], r.passed)
                                          for r in run.records])
        rows.append(Summary(run.label, run.policy, len(run.records), sum(r.passed for r in run.records), p,
                            binomial_stderr(p, len(run.records)), run.large_share, run.tokens_per_s,
                            run.output_tokens, run.wall_s, ratio, meets, gained, lost, p_value, interval))
    return rows


def _pass_rate(run: PolicyRun) -> float:
    return sum(r.passed for r in run.records) / len(run.records) if run.records else 0.0


def write_json(path: Path, meta: dict[str, Any], runs: Sequence[PolicyRun]) -> None:
    """Everything: the run's settings, one summary row per policy setting, and every problem's record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"meta": meta, "summary": [asdict(s) for s in summarize(runs)], "runs": [r.to_dict() for r in runs]}
    path.write_text(json.dumps(payload, indent=1) + "\n")


def read_json(path: Path) -> tuple[dict[str, Any], list[PolicyRun]]:
    payload = json.loads(path.read_text())
    return payload["meta"], [PolicyRun.from_dict(r) for r in payload["runs"]]


def markdown_table(rows: Sequence[Summary]) -> str:
    header = ["policy", "N", "pass@1", "± s.e.", "vs SLM-only (+/−)", "p (McNemar)", "large-model share", "tokens/s",
              "gain ratio", "95 % interval", "target"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for s in rows:
        ratio = "—" if s.gain_ratio is None else f"{s.gain_ratio:.2f}"
        target = "—" if s.label in (SLM, LLM) else ("**yes**" if s.meets_target else "no")
        baseline = s.label == SLM
        paired = "—" if s.gained is None or baseline else f"+{s.gained} / −{s.lost}"
        p_value = "—" if s.p_vs_slm is None or baseline else f"{s.p_vs_slm:.3f}"
        interval = "—" if s.gain_ci is None or s.label in (SLM, LLM) else f"[{s.gain_ci[0]:.2f}, {s.gain_ci[1]:.2f}]"
        lines.append(f"| `{s.label}` | {s.n} | {s.pass_at_1:.3f} ({s.passed}/{s.n}) | {s.stderr:.3f} | {paired} | "
                     f"{p_value} | {s.large_share:.1%} | {s.tokens_per_s:.1f} | {ratio} | {interval} | {target} |")
    return "\n".join(lines) + "\n"


def plot_frontier(rows: Sequence[Summary], path: Path, title: str) -> None:
    """pass@1 (with ± s.e.) against throughput, one labelled point per policy setting."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display here
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    for s in rows:
        color = "tab:gray" if s.label in (SLM, LLM) else ("tab:green" if s.meets_target else "tab:blue")
        ax.errorbar(s.tokens_per_s, s.pass_at_1, yerr=s.stderr, fmt="o", color=color, capsize=3)
        ax.annotate(f"{s.label}\n({s.large_share:.0%} large)", (s.tokens_per_s, s.pass_at_1),
                    textcoords="offset points", xytext=(6, 4), fontsize=7)
    ax.set_xlabel("throughput (output tokens/s, CPU, approximate)")
    ax.set_ylabel("HumanEval pass@1")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
