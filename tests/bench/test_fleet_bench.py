"""The fleet suite's report and plot on a result of run_replicas' shape (the runs themselves start
Dynamo fleets: docs/benchmarks.md, "Fleet", has the command)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenrouter.config import load_config
from tokenrouter_tools.bench import fleet
from tokenrouter_tools.bench.plots import plot_fleet


def test_markdown_and_plot_show_throughput_per_replica(tmp_path: Path) -> None:
    runs = {f"{r} replicas": [{"throughput": 100.0 * r * f, "per_replica": 100.0 * f, "ttft_median_s": 0.05}
                              for f in (1.0, 0.9, 1.1)] for r in (1, 2, 4)}
    result = {"per_replica_clients": 32, "runs": runs, "reps": 3, "target": 0.9,
              "medians": {name: {"throughput": rows[0]["throughput"], "ttft_median_s": 0.05}
                          for name, rows in runs.items()},
              "scaling": {name: {"per_rep": [1.0, 1.0, 1.0], "median": 1.0} for name in runs}}
    text = fleet.markdown(result)
    assert "| 4 replicas | 128 | 400.0 |" in text and "| 100.0 |" in text
    assert plot_fleet(result, tmp_path / "fleet.png").stat().st_size > 0


def test_cpu_seconds_of_a_fleet_not_started_names_what_is_missing(tmp_path: Path) -> None:
    config = load_config({"models": {"slm": {"engine": "simulated", "profile": "tiny-cpu-small"},
                                     "llm": {"engine": "simulated", "profile": "tiny-cpu-large"}}})
    with pytest.raises(RuntimeError, match="has not been started"):
        fleet.Fleet(config, 1, tmp_path).cpu_seconds()
