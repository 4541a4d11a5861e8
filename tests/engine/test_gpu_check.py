"""tools/gpu_check.py: the CPU miniature runs end to end and every check in it passes; each check fails
on an engine with the fault it exists to catch; the report and its exit status say what failed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tokenrouter.engine.base import StepRow
from tokenrouter.engine.torch_engine import TorchEngine
from tokenrouter_tools.gpu_check_common import Budget, load_model, mixed_prompts, run_part
from tokenrouter_tools.gpu_check_report import FAILED, INCOMPLETE, PASSED, failures, skips, summary, verdict
from tokenrouter_tools.gpu_check_routed import routed_equals_reference
from tokenrouter_tools.gpu_check_torch import greedy_equals_generate, resume_computes_only_new_tokens

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "gpu_check.py"
# What the GPU machine's python3 lacks (docs/engine.md, "GPU check"): the torch parts must run without them.
ABSENT_ON_GPU_MACHINE = ("pydantic", "vllm", "tritonclient")


def _run(tmp_path: Path, *args: str, status: int, absent: tuple[str, ...] = ()) -> tuple[dict, str]:
    """The check in a fresh interpreter; ``absent`` packages fail to import there as if not installed
    (None in sys.modules: ``import`` raises ModuleNotFoundError, ``importlib.util.find_spec`` gives None)."""
    out = tmp_path / "report.json"
    hide = (f"import runpy, sys; sys.modules.update(dict.fromkeys({list(absent)!r})); sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    run = subprocess.run([sys.executable, "-c", hide, str(SCRIPT), "--cpu", "--out", str(out), *args],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == status, run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert json.loads(run.stdout) == report  # stdout carries the same report
    return report, run.stderr


def _passed(node: dict) -> None:
    assert node.get("passed") is True, node


def test_cpu_miniature_passes_every_check_and_measures(tmp_path: Path) -> None:
    """Without pydantic, vLLM or tritonclient, as on the GPU machine: every torch check passes, and the
    vLLM part is skipped, saying why, which leaves the run INCOMPLETE (exit 3), not PASSED."""
    report, stderr = _run(tmp_path, status=INCOMPLETE, absent=ABSENT_ON_GPU_MACHINE)
    assert report["environment"]["device"] == "cpu"
    torch_engine = report["torch_engine"]
    exact = torch_engine["exact"]
    for size in ("small", "large"):
        _passed(exact[f"greedy_equals_generate_{size}"])
        assert exact[f"greedy_equals_generate_{size}"]["rows_equal"] == "4/4"
    resume = exact["resume_computes_only_new_tokens"]
    _passed(resume)
    assert resume["tokens_fed_on_resume_step"] == resume["expected_fed"] == 4
    routed = torch_engine["routed_equals_reference"]
    _passed(routed)
    assert routed["requests_equal"] == "6/6" and routed["large_model_tokens"] > 0
    bench = torch_engine["tokenrouter_vs_large_alone"]
    for n in (2, 4):
        row = bench[f"n_{n}"]
        assert row["tokenrouter_tok_s"] > 0 and row["large_alone_tok_s"] > 0 and 0 < row["large_model_share"] < 1
    tiny = torch_engine["shapes"]["tiny"]
    assert tiny["greedy_vs_generate"]["tokens_equal"] is True
    assert tiny["greedy_vs_generate"]["first_step_max_abs_logit_diff"] < 1e-4
    for per_batch in tiny["decode"].values():
        assert set(per_batch) == {"batch_1_ms_per_step", "batch_8_ms_per_step"}
        assert all(ms > 0 for ms in per_batch.values())
    assert set(tiny["decode"]) == {"context_64", "context_128"}
    mixed = tiny["mixed_prefill_decode_step"]
    assert (mixed["prefill_tokens"], mixed["decode_rows"]) == (128, 7) and mixed["ms"] > 0
    assert tiny["sdpa"]["dispatched_ops"] and tiny["sdpa"]["forced_backend_runs"]["MATH"] is True
    assert report["vllm_engine"]["skipped"].startswith("vllm not importable: ModuleNotFoundError")
    assert failures(report) == [] and skips(report) == ["vllm_engine"]
    assert "torch_engine/routed_equals_reference" in stderr  # the summary table
    assert "INCOMPLETE, not a full pass (4 passed, 0 failed, 1 skipped): vllm_engine" in stderr


def test_a_skip_is_never_a_pass() -> None:
    """A part that did not run keeps the run from PASSED, in the exit status and in the summary's
    last lines, and shows as SKIPPED with its reason; only a run with every check passed is PASSED."""
    ran = {"torch_engine": {"exact": {"passed": True}}, "wall_s": 9.0}
    assert verdict(ran) == (PASSED, "PASSED (1 passed, 0 failed, 0 skipped)")
    cut_short = {"torch_engine": {"exact": {"passed": True}}}  # saved mid-run: the later parts are not in it
    assert verdict(cut_short)[0] == INCOMPLETE and "did not finish" in verdict(cut_short)[1]
    report = ran | {"vllm_engine": {"skipped": "vllm not importable: ModuleNotFoundError"}}
    status, line = verdict(report)
    assert status == INCOMPLETE != PASSED and line.startswith("INCOMPLETE") and "vllm_engine" in line
    table = summary(report)
    assert "PASSED" not in table and line in table
    assert any(row.split()[:2] == ["vllm_engine", "SKIPPED"] and "vllm not importable" in row
               for row in table.splitlines())
    assert verdict({"torch_engine": {"skipped": "time budget spent"}, "wall_s": 0.1})[0] == INCOMPLETE
    assert verdict({"torch_engine": {"shapes": {}}, "wall_s": 0.1}) == (
        INCOMPLETE, "INCOMPLETE, not a full pass (0 passed, 0 failed, 0 skipped): no check ran")
    assert verdict(report | {"routed": {"error": "OSError: boom"}})[0] == FAILED  # a failure outranks a skip


def test_a_spent_budget_skips_every_part_and_says_so(tmp_path: Path) -> None:
    from tokenrouter_tools.gpu_check import main

    assert main(["--cpu", "--budget-s", "0", "--out", str(tmp_path / "r.json")]) == INCOMPLETE
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["torch_engine"] == {"skipped": "time budget spent"}
    assert report["vllm_engine"] == {"skipped": "time budget spent"}


def test_a_failing_part_is_reported_and_the_check_goes_on() -> None:
    def broken() -> None:
        raise ValueError("bad shape")

    result = run_part(broken, Budget(60))
    assert result["error"] == "ValueError: bad shape" and "broken" in result["trace"]
    assert run_part(lambda: 42, Budget(60)) == 42


def test_a_failed_check_fails_the_run_and_is_named(tmp_path: Path, monkeypatch) -> None:
    import tokenrouter_tools.gpu_check as gpu_check

    monkeypatch.setattr(gpu_check, "routed_torch", lambda pair, plan: {"passed": False, "requests_equal": "5/6"})
    monkeypatch.setattr(gpu_check.Plan, "for_device", classmethod(
        lambda cls, cpu: gpu_check.Plan("cpu", torch.float32, (), (1,), (16,), 16, 4, 2, 1, "qwen2", 2, 3, None, (1,),
                                        2, 1, 0.3, 0.3)))
    assert gpu_check.main(["--cpu", "--skip-vllm", "--out", str(tmp_path / "r.json")]) == FAILED
    report = json.loads((tmp_path / "r.json").read_text())
    assert failures(report) == ["torch_engine/routed_equals_reference"]
    assert report["vllm_engine"] == {"skipped": "--skip-vllm given"}
    assert "FAILED (3 passed, 1 failed, 1 skipped): torch_engine/routed_equals_reference" in summary(report)


# --- each check catches the fault it is for -------------------------------------------------------
class DroppingForeignTokens(TorchEngine):
    """Feeds only the first token of a multi-token row that extends a cached sequence (a resume that
    loses the other model's tokens); the rest of the contract holds."""

    def step(self, rows, **kwargs):
        rows = [StepRow(r.seq_id, r.new_tokens[:1], r.sampling) if self.num_cached(r.seq_id) and len(r.new_tokens) > 1
                else r for r in rows]
        return super().step(rows, **kwargs)


class Refeeding(TorchEngine):
    """A resume that recomputes the whole context (release, add again, feed everything)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.contexts: dict = {}

    def step(self, rows, **kwargs):
        fed = []
        for row in rows:
            context = self.contexts.setdefault(row.seq_id, [])
            if context and len(row.new_tokens) > 1:
                self.release(row.seq_id)
                self.add_sequence(row.seq_id)
                fed.append(StepRow(row.seq_id, context + list(row.new_tokens), row.sampling))
            else:
                fed.append(row)
            context.extend(row.new_tokens)
        return super().step(fed, **kwargs)


class SwappingRows(TorchEngine):
    """Hands each row the logits and token of the next row when more than one row runs."""

    def step(self, rows, **kwargs):
        result = super().step(rows, **kwargs)
        if len(rows) > 1:
            result.logits, result.sampled = result.logits.roll(1, 0), result.sampled.roll(1, 0)
        return result


def _engine(cls, model) -> TorchEngine:
    return cls("faulty", model, num_blocks=256, block_size=16)


@pytest.fixture(scope="module")
def qwen2_pair(tiny_pair_factory) -> dict[str, Path]:
    return tiny_pair_factory("qwen2", 0)


def test_greedy_check_catches_rows_mixed_up(qwen2_pair) -> None:
    model = load_model(qwen2_pair["small"], "cpu")
    prompts = mixed_prompts(4, model.config.vocab_size, seed=11)
    assert greedy_equals_generate(_engine(TorchEngine, model), model, prompts, 6)["passed"] is True
    assert greedy_equals_generate(_engine(SwappingRows, model), model, prompts, 6)["passed"] is False


@pytest.mark.parametrize("faulty", [Refeeding, DroppingForeignTokens])
def test_resume_check_catches_a_recomputed_or_lost_context(qwen2_pair, faulty) -> None:
    model = load_model(qwen2_pair["large"], "cpu")
    vocab = model.config.vocab_size
    assert resume_computes_only_new_tokens(_engine(TorchEngine, model), model, vocab)["passed"] is True
    assert resume_computes_only_new_tokens(_engine(faulty, model), model, vocab)["passed"] is False


def test_routed_check_catches_a_resume_that_loses_the_peers_tokens(qwen2_pair) -> None:
    models = {"slm": load_model(qwen2_pair["small"], "cpu"), "llm": load_model(qwen2_pair["large"], "cpu")}
    prompts = mixed_prompts(4, models["slm"].config.vocab_size, seed=41)
    good = {name: _engine(TorchEngine, model) for name, model in models.items()}
    assert routed_equals_reference(good, models, prompts, 10, rate=0.3)["passed"] is True
    faulty = {"slm": _engine(DroppingForeignTokens, models["slm"]), "llm": _engine(TorchEngine, models["llm"])}
    result = routed_equals_reference(faulty, models, prompts, 10, rate=0.3)
    assert result["passed"] is False and result["requests_equal"] != "4/4"


@pytest.mark.slow
def test_cpu_miniature_with_the_vllm_engine(tmp_path: Path) -> None:
    """A few minutes on two cores: vLLM's start-up and CPU attention."""
    pytest.importorskip("vllm")
    report, stderr = _run(tmp_path, "--budget-s", "600", status=PASSED)  # a loaded machine: no part left out
    vllm = report["vllm_engine"]
    _passed(vllm["engine_loads"])
    assert vllm["engine_loads"]["settings"]["input_batch"] is True
    assert "CPU miniature" in vllm["tensor_parallel"]["skipped"]  # TP 2 on CPU: its own test module
    for name, check in vllm["exact"].items():
        assert check.get("passed") is True, (name, check)
    bench = vllm["bench"]
    _passed(bench["captured_logits_match_sampler_logprobs"])
    for n in (2, 4):
        assert bench["adapter_vs_native"][f"batch_{n}"]["adapter_tok_s"] > 0
        assert bench["tokenrouter_vs_large_alone"][f"n_{n}"]["tokenrouter_tok_s"] > 0
    assert failures(report) == skips(report) == [] and "PASSED (" in stderr
