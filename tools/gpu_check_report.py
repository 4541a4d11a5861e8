"""The device check's report read back: which checks failed or were skipped, the exit status, and a
summary table for people.

    python3 tools/gpu_check_report.py gpu-report.json   # the table of a saved (or partly written) report
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Iterator

DETAIL_WIDTH = 90
# Exit statuses of the check. A skipped part is not a pass: a run with any skip (vLLM not installed,
# the time budget spent, --skip-vllm) ends INCOMPLETE, never PASSED. 2 is gpu_check's "no CUDA device".
PASSED, FAILED, INCOMPLETE = 0, 1, 3
FINISHED = "wall_s"  # set once every part has returned: a report saved mid-run (a run cut short) lacks it
MEASURED = ("_tok_s", "_ms_per_step", "ms")  # keys of the numbers a benchmark row shows


def _walk(node: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    if not isinstance(node, dict):
        return
    yield path, node
    for key, value in node.items():
        yield from _walk(value, f"{path}/{key}" if path else key)


def _outcome(node: dict[str, Any]) -> str | None:
    """pass / FAIL / ERROR / SKIPPED for a node that is a check's result (or a part that did not run)."""
    if "passed" in node:
        return "pass" if node["passed"] is True else "FAIL"
    if "error" in node:
        return "ERROR"
    if set(node) == {"skipped"}:
        return "SKIPPED"
    return None


def _paths(report: dict[str, Any], *outcomes: str) -> list[str]:
    return [path for path, node in _walk(report, "") if _outcome(node) in outcomes]


def failures(report: dict[str, Any]) -> list[str]:
    """Paths of the checks that failed and of the parts that raised."""
    return _paths(report, "FAIL", "ERROR")


def skips(report: dict[str, Any]) -> list[str]:
    """Paths of the parts that did not run (each says why in the report)."""
    return _paths(report, "SKIPPED")


def verdict(report: dict[str, Any]) -> tuple[int, str]:
    """(exit status, one line): PASSED only when the run finished, checks ran, none failed and nothing
    was skipped."""
    failed, skipped, passed = failures(report), skips(report), _paths(report, "pass")
    counts = f"{len(passed)} passed, {len(failed)} failed, {len(skipped)} skipped"
    if failed:
        return FAILED, f"FAILED ({counts}): {', '.join(failed)}"
    missing = list(skipped)
    if not passed:
        missing.append("no check ran")
    if FINISHED not in report:
        missing.append("the run did not finish (a report saved mid-run)")
    if missing:
        return INCOMPLETE, f"INCOMPLETE, not a full pass ({counts}): {', '.join(missing)}"
    return PASSED, f"PASSED ({counts})"


def _detail(node: dict[str, Any]) -> str:
    if "error" in node:
        text = str(node["error"])
    elif "skipped" in node:
        text = str(node["skipped"])
    else:
        text = " ".join(f"{key}={value}" for key, value in node.items()
                        if key != "passed" and not isinstance(value, (dict, list)))
    return text if len(text) <= DETAIL_WIDTH else text[:DETAIL_WIDTH - 3] + "..."


def summary(report: dict[str, Any]) -> str:
    """Checks (pass / FAIL / ERROR / SKIPPED, with why), then measurements (tokens per second, ms per
    step) and informative comparisons (bfloat16 greedy tokens of random weights vs generate)."""
    checks, benchmarks = [], []
    for path, node in _walk(report, ""):
        outcome = _outcome(node)
        if outcome is not None:
            checks.append((path, outcome, _detail(node)))
        elif any(key.endswith(MEASURED) or key == "tokens_equal" for key in node):
            benchmarks.append((path, _detail(node)))
    width = max([len(path) for path, *_ in checks + benchmarks] + [5])
    lines = [f"{'check'.ljust(width)}  result   detail"]
    lines += [f"{path.ljust(width)}  {outcome.ljust(7)}  {detail}" for path, outcome, detail in checks]
    if benchmarks:
        lines += ["", f"{'measured'.ljust(width)}  values"]
        lines += [f"{path.ljust(width)}  {detail}" for path, detail in benchmarks]
    lines += ["", verdict(report)[1], f"wall {report.get('wall_s', '?')} s"]
    return "\n".join(lines)


if __name__ == "__main__":
    saved = json.loads(Path(sys.argv[1]).read_text())
    print(summary(saved))
    raise SystemExit(verdict(saved)[0])
