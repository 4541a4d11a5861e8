"""`tokenrouter bench against`: the arithmetic of its ratios and its baseline tree (the runs
themselves take minutes and are a benchmark, not a test)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tokenrouter_tools.bench import against


def served_result(throughput: dict[tuple[int, str], float]) -> dict:
    """The part of a `bench served --reps 1` result the comparison reads."""
    clients = sorted({n for n, _ in throughput})
    return {"points": [{"clients": n, "medians": {s: {"throughput": t} for (m, s), t in throughput.items() if m == n}}
                       for n in clients]}


def test_ratios_are_of_neighbouring_runs_not_of_medians() -> None:
    """A machine that slows down between rounds moves both trees alike: the per-round ratios stay
    at 0.5 even though the median of new (20) over the median of base (100) would say 0.2."""
    rounds = [{"base": {(64, "served"): b, (64, "embedded"): 10.0},
               "new": {(64, "served"): b / 2, (64, "embedded"): 12.0}} for b in (100.0, 40.0, 160.0)]
    rows = {(r["clients"], r["system"]): r for r in against.compare_rounds(rounds)}
    assert rows[64, "served"]["ratios"] == [0.5, 0.5, 0.5] and rows[64, "served"]["ratio"] == 0.5
    assert rows[64, "served"]["base"] == [100.0, 40.0, 160.0]
    assert rows[64, "embedded"]["ratio"] == pytest.approx(1.2)


def test_throughputs_reads_every_concurrency_and_system() -> None:
    result = served_result({(8, "embedded"): 1.0, (8, "served"): 2.0, (16, "embedded"): 3.0, (16, "served"): 4.0})
    assert against.throughputs(result) == {(8, "embedded"): 1.0, (8, "served"): 2.0, (16, "embedded"): 3.0,
                                           (16, "served"): 4.0}


def test_throughputs_reads_the_systems_the_run_was_asked_for() -> None:
    """`--systems served two-servers` measures no embedded runtime: both systems it did measure are read."""
    result = served_result({(64, "served"): 1.0, (64, "two-servers"): 2.0})
    assert against.throughputs(result) == {(64, "served"): 1.0, (64, "two-servers"): 2.0}


def test_baseline_tree_runs_the_baseline_commits_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The baseline's python imports the package from the baseline's checkout, not from this tree."""
    monkeypatch.setattr(against, "runtime_dir", lambda: tmp_path)
    tree, python = against.baseline_tree("HEAD")
    try:
        where = subprocess.run([str(python), "-c", "import tokenrouter, torch; print(tokenrouter.__file__)"],
                               check=True, capture_output=True, text=True).stdout.strip()
        assert Path(where).is_relative_to(tree)
        assert against.baseline_tree("HEAD") == (tree, python)  # made once, reused
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], check=True)
