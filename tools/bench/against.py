"""`tokenrouter bench against REF`: the served benchmark on this tree and on a baseline commit, runs
alternated (base, new, then new, base, ...), so a change that slows the routed path shows as a ratio
before it lands. A benchmark, not a test: on a shared machine only ratios of neighbouring runs mean
anything.

The baseline is a detached git worktree under .runtime/against/<commit> with a virtual environment
layered on this one (a path file pointing at this venv's site-packages, plus an editable install of
that tree), so it shares every dependency and runs its own code. Each run is one `tokenrouter bench
served --reps 1` in a process of its own (a server started, measured and stopped), every system it
measures compared (by default the embedded runtime and the served path; `--systems` in the served
options picks others, e.g. `served two-servers`).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any, Sequence

from tqdm import tqdm

from tokenrouter.launch.paths import runtime_dir

from .report import fmt, table

TREES = ("base", "new")


def _git(*args: str, cwd: Path | None = None) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def baseline_tree(ref: str) -> tuple[Path, Path]:
    """(the baseline's checkout, its python), made once per commit and reused."""
    commit = _git("rev-parse", "--verify", f"{ref}^{{commit}}")
    tree = runtime_dir() / "against" / commit[:12]
    if not (tree / ".git").exists():
        tree.parent.mkdir(parents=True, exist_ok=True)
        _git("worktree", "add", "--detach", str(tree), commit)
    python = tree / ".venv" / "bin" / "python"
    if not python.exists():
        # the base interpreter under this venv: CPython's sys._base_executable, which typeshed leaves out
        base_python = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base_python, "-m", "venv", str(tree / ".venv")], check=True)
        site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
        # sorted before the editable finder's own path file, which imports setuptools from here
        (Path(site) / "0-base-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "-e",
                        str(tree)], check=True)
    return tree, python


def _run_served(tree: Path, python: Path, served_args: Sequence[str], out: Path) -> dict[str, Any]:
    # The tree's own console script: the module behind `tokenrouter` differs between commits
    # (tokenrouter_tools.cli before the launcher moved into the package, tokenrouter.launch.cli since).
    cli = python.parent / "tokenrouter"
    run = subprocess.run([str(cli), "bench", "served", "--reps", "1", "--json", str(out), *served_args],
                         cwd=tree, capture_output=True, text=True)
    if run.returncode != 0:  # its progress bars stay quiet; its error does not
        raise RuntimeError(f"bench served in {tree} failed ({run.returncode}):\n{run.stderr[-3000:]}")
    return json.loads(out.read_text())


def throughputs(result: dict[str, Any]) -> dict[tuple[int, str], float]:
    """(clients, system) -> output tokens/s of one `bench served --reps 1` result, every system it measured."""
    return {(point["clients"], system): medians["throughput"]
            for point in result["points"] for system, medians in point["medians"].items()}


def compare_rounds(rounds: list[dict[str, dict[tuple[int, str], float]]]) -> list[dict[str, Any]]:
    """Per (clients, system): each tree's throughput per round and the median of the per-round
    ratios new / base (a ratio of neighbours, not of two medians taken minutes apart)."""
    rows = []
    for key in rounds[0]["base"]:
        base = [r["base"][key] for r in rounds]
        new = [r["new"][key] for r in rounds]
        ratios = [n / b for n, b in zip(new, base) if b]
        rows.append({"clients": key[0], "system": key[1], "base": base, "new": new, "ratios": ratios,
                     "ratio": statistics.median(ratios) if ratios else None})
    return rows


def run_against(ref: str, served_args: Sequence[str], rounds: int) -> dict[str, Any]:
    base_tree, base_python = baseline_tree(ref)
    trees = {"base": (base_tree, base_python), "new": (Path.cwd(), Path(sys.executable))}
    measured: list[dict[str, dict[tuple[int, str], float]]] = []
    with tempfile.TemporaryDirectory(prefix="bench-against-") as tmp, tqdm(total=2 * rounds, desc="runs") as bar:
        for i in range(rounds):
            order = TREES if i % 2 == 0 else TREES[::-1]
            this_round = {}
            for name in order:
                tree, python = trees[name]
                this_round[name] = throughputs(_run_served(tree, python, served_args, Path(tmp) / f"{name}-{i}.json"))
                bar.update()
            measured.append(this_round)
    return {"suite": "against", "base": _git("rev-parse", "HEAD", cwd=base_tree),
            "new": _git("rev-parse", "HEAD") + (" (+ uncommitted changes)" if _git("status", "--porcelain",
                                                                                    "--untracked-files=no") else ""),
            "served_args": list(served_args), "rounds": rounds, "rows": compare_rounds(measured)}


def markdown(result: dict[str, Any]) -> str:
    head = f"base {result['base'][:12]}, new {result['new'][:12]}{result['new'][40:]}, {result['rounds']} rounds"
    return head + "\n\n" + table(
        ["N", "system", "base tokens/s per round", "new tokens/s per round", "new / base per round",
         "new / base (median)"],
        [[r["clients"], r["system"], ", ".join(fmt(x) for x in r["base"]), ", ".join(fmt(x) for x in r["new"]),
          ", ".join(fmt(x) for x in r["ratios"]), r["ratio"]] for r in result["rows"]])
