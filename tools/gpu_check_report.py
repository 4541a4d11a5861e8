"""The device check's report read back: which checks failed, and a summary table for people."""

from __future__ import annotations

from typing import Any, Iterator

DETAIL_WIDTH = 90
MEASURED = ("_tok_s", "_ms_per_step", "ms")  # keys of the numbers a benchmark row shows


def _walk(node: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    if not isinstance(node, dict):
        return
    yield path, node
    for key, value in node.items():
        yield from _walk(value, f"{path}/{key}" if path else key)


def _outcome(node: dict[str, Any]) -> str | None:
    """pass / FAIL / ERROR / skipped for a node that is a check's result (or a part that did not run)."""
    if "passed" in node:
        return "pass" if node["passed"] is True else "FAIL"
    if "error" in node:
        return "ERROR"
    if set(node) == {"skipped"}:
        return "skipped"
    return None


def failures(report: dict[str, Any]) -> list[str]:
    """Paths of the checks that failed and of the parts that raised."""
    return [path for path, node in _walk(report, "") if _outcome(node) in ("FAIL", "ERROR")]


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
    """Checks (pass / FAIL / ERROR / skipped, with why), then measurements (tokens per second, ms per
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
    failed = failures(report)
    lines += ["", f"{len(failed)} failed: {', '.join(failed)}" if failed else "no check failed",
              f"wall {report.get('wall_s', '?')} s"]
    return "\n".join(lines)
