"""The pools suite's pieces that need no fleet: its layouts, the prediction's inputs from a simulated
config, the fleet command for a split, how a pool worker's log tells its links, and the report and plot
on a result of run_pool_splits' shape (the runs themselves start Dynamo fleets: docs/benchmarks.md)."""

from __future__ import annotations

from pathlib import Path

from tokenrouter.config import load_config
from tokenrouter_tools.bench import fleet, pool_splits
from tokenrouter_tools.bench.plots import plot_pool_splits

SIM_A100 = Path(__file__).resolve().parents[2] / "configs" / "sim-a100.yaml"


def test_the_layouts_are_the_pairs_then_every_split():
    assert pool_splits.layouts(6) == ["3 pairs", "1+5", "2+4", "3+3", "4+2", "5+1"]


def test_the_prediction_reads_the_simulated_step_latencies_and_the_routing_rate():
    small, large = pool_splits.latencies(load_config(SIM_A100), 48)
    assert len(small) == len(large) == 48
    assert (round(small[0] * 1e3, 3), round(large[0] * 1e3, 3), round((large[9] - large[0]) * 1e3, 3)) \
        == (6.0, 27.9, 3.6)  # the paper's one-row steps, 0.4 ms per row more
    assert pool_splits.routing(0.05) == ([[0.95, 0.05], [1.0, 0.0]], [[1, 0], [1, 0]])


def test_a_split_starts_a_pools_fleet_and_is_ready_once_every_worker_logged_its_links(tmp_path: Path):
    split = fleet.Fleet(load_config(SIM_A100), 3, tmp_path, pools="2+1")
    assert split.command[split.command.index("--pools") + 1] == "2+1" and "--replicas" not in split.command
    for m in range(2):
        (tmp_path / f"entry-{m}.log").write_text("x INFO slm: linked to llm at llm instance a1\n")
    (tmp_path / "peer-llm-0.log").write_text("llm: linked to slm at slm instance b\n" * 2)
    assert not split._workers_ready()  # the peer linked one entry of two (the same one, twice)
    (tmp_path / "peer-llm-0.log").write_text("llm: linked to slm at slm instance b\nllm: linked to slm at c\n")
    assert split._workers_ready()


def test_markdown_and_plot_show_each_layout_beside_its_prediction(tmp_path: Path):
    def row(throughput: float, predicted: float) -> dict:
        runs = [{"throughput": throughput * f, "load": 2.0} for f in (1.0, 0.9, 1.1)]
        return {"runs": runs, "median": {"throughput": throughput}, "cpu_s": {"frontend": 1.0, "worker 1": 2.0},
                "predicted": predicted}

    result = {"clients": 48, "budget": 6, "reps": 3,
              "results": {"0.35": {"3 pairs": row(1000.0, 1100.0), "2+4": row(1050.0, 1120.0)}}}
    text = pool_splits.markdown(result)
    assert "| 2+4 | 1050.0 |" in text and "+5.0%" in text and "-9.1%" in text and "| 3 |" in text
    assert plot_pool_splits(result, tmp_path / "pools.png").stat().st_size > 0
