"""The paper-style table of `bench-vllm serving`: medians over repetitions per system and N, and the
engines' busy shares where a system reports them (TokenRouter's, off its server's metrics port)."""

from __future__ import annotations

import pytest

from tokenrouter_tools.bench.vllm_serving import medians, report


def _run(system: str, rep: int, throughput: float, busy: dict[str, float]) -> dict:
    return {"system": system, "rep": rep, "clients": 8, "throughput": throughput, "ttft_median_s": 1.0,
            "latency_median_s": 5.0, "per_user_median_tok_s": 2.0, "large_share": 0.2, "errors": 0, "busy": busy}


def test_medians_carry_each_engines_busy_share_and_the_report_shows_it():
    runs = [_run("tokenrouter", 0, 10.0, {"slm": 0.5, "llm": 0.9}),
            _run("tokenrouter", 1, 12.0, {"slm": 0.7, "llm": 1.0}),
            _run("tokenrouter", 2, 11.0, {"slm": 0.6, "llm": 0.95}),
            *[_run("large_alone", rep, 20.0 + rep, {}) for rep in range(3)]]
    points = medians(runs, ["tokenrouter", "large_alone"], [8])
    tokenrouter, alone = points
    assert tokenrouter["throughput"] == 11.0 and tokenrouter["busy"] == pytest.approx({"slm": 0.6, "llm": 0.95})
    assert alone["busy"] == {}
    text = report({"points": points, "systems": ["tokenrouter", "large_alone"]})
    assert "llm 95" in text and "slm 60" in text and "engines busy" in text
