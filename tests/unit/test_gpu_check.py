"""tools/gpu_check.py: the CPU miniature runs end to end and its JSON report says what ran and what did not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "gpu_check.py"


def _run(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "report.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--cpu", "--out", str(out), *args], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert json.loads(run.stdout) == report  # stdout carries the same report
    return report


def test_cpu_miniature_checks_correctness_speed_mixed_steps_and_sdpa(tmp_path: Path) -> None:
    report = _run(tmp_path, "--skip-vllm")
    assert report["environment"]["device"] == "cpu"
    tiny = report["torch_engine"]["tiny"]
    assert tiny["greedy_vs_generate"]["tokens_equal"] is True
    assert tiny["greedy_vs_generate"]["first_step_max_abs_logit_diff"] < 1e-4
    speeds = tiny["decode"]
    assert set(speeds) == {"context_64", "context_128"}
    for per_batch in speeds.values():
        assert set(per_batch) == {"batch_1_ms_per_step", "batch_8_ms_per_step"}
        assert all(ms > 0 for ms in per_batch.values())
    mixed = tiny["mixed_prefill_decode_step"]
    assert (mixed["prefill_tokens"], mixed["decode_rows"]) == (128, 7) and mixed["ms"] > 0
    sdpa = tiny["sdpa"]
    assert sdpa["dispatched_ops"] and sdpa["forced_backend_runs"]["MATH"] is True
    assert report["vllm_engine"] == {"skipped": "--skip-vllm given"}


def test_a_spent_budget_skips_every_part_and_says_so(tmp_path: Path) -> None:
    from tokenrouter_tools.gpu_check import main

    assert main(["--cpu", "--budget-s", "0", "--out", str(tmp_path / "r.json")]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["torch_engine"] == {"tiny": {"skipped": "time budget spent"}}
    assert report["vllm_engine"] == {"skipped": "time budget spent"}


def test_a_failing_part_is_reported_and_the_check_goes_on() -> None:
    from tokenrouter_tools.gpu_check import Budget, run_part

    def broken() -> None:
        raise ValueError("bad shape")

    result = run_part(broken, Budget(60))
    assert result["error"] == "ValueError: bad shape" and "broken" in result["trace"]
    assert run_part(lambda: 42, Budget(60)) == 42


@pytest.mark.slow
def test_cpu_miniature_with_the_vllm_engine(tmp_path: Path) -> None:
    """About a minute on two cores: vLLM's start-up and CPU attention."""
    pytest.importorskip("vllm")
    report = _run(tmp_path)
    vllm = report["vllm_engine"]
    assert vllm["greedy_equals_torch_engine"] is True, vllm
    assert all(ms > 0 for per_batch in vllm["decode"].values() for ms in per_batch.values())
