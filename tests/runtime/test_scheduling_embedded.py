"""Scheduling rules held on the running embedded runtime (real loops and threads, simulated
engines so that it runs at speed): delayed batching as configured, and cancellation of running
requests."""

from __future__ import annotations

import time

from tokenrouter.runtime.api import TokenRouter
from tokenrouter.runtime.observers import StepObserver

LLM_B = [1, 2, 3, 3]  # B of the large model at N = 1, 2, 3, 4 (sum(B_i - 1) < N holds)


def _config(llm_b, *, max_wait_ms: float = 10_000.0, base_ms: float = 0.5) -> dict:
    # eos_rate 0: every request runs to max_tokens, whatever positions the token source hashes to eos
    return {"models": {"slm": {"engine": "simulated",
                               "profile": {"base": "tiny-cpu-small", "base_ms": base_ms, "eos_rate": 0.0}},
                       "llm": {"engine": "simulated",
                               "profile": {"base": "tiny-cpu-large", "base_ms": 2 * base_ms, "eos_rate": 0.0},
                               "batch_threshold": llm_b}},
            "policy": {"name": "random", "params": {"rate": 0.3, "seed": 5, "run_length": 4}},
            "scheduling": {"strategy": "tokenrouter", "max_active": 4, "max_wait_ms": max_wait_ms}}


class RowsAndActive(StepObserver):
    """(rows, N) of every step, as the model's loop saw N when it scheduled the step."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, int]] = []

    def on_step(self, server, record, routed) -> None:
        self.steps.append((len(record.rows), server.active))


def test_every_large_model_step_has_at_least_its_threshold_of_rows():
    """Rule: with a max_wait far beyond the run, every step of the large model has at least
    min(B(N), N) rows. Catches delayed batching switched off (the old suite passed without it)."""
    observer = RowsAndActive()
    with TokenRouter.from_config(_config(LLM_B)) as engine:
        engine.subservers["llm"].observers.append(observer)
        prompts = [[3 + i, 7, 9, 11][: 1 + i % 4] for i in range(12)]
        results = engine.generate(prompts, max_tokens=40, timeout=60)
    assert all(r.finish_reason == "length" and len(r.token_ids) == 40 for r in results)
    assert observer.steps, "the large model never stepped"
    short = [(rows, n) for rows, n in observer.steps if rows < min(LLM_B[min(n, 4) - 1], n)]
    assert short == [], f"{len(short)} of {len(observer.steps)} large-model steps ran below B(N)"
    assert any(rows >= 3 for rows, _ in observer.steps)


def test_without_delay_the_same_load_runs_short_steps():
    """The control for the test above: with B = 1 the large model does run single-row steps
    while more requests are active, so the assertion above can fail."""
    observer = RowsAndActive()
    with TokenRouter.from_config(_config(1)) as engine:
        engine.subservers["llm"].observers.append(observer)
        engine.generate([[3 + i, 7, 9, 11][: 1 + i % 4] for i in range(12)], max_tokens=40, timeout=60)
    assert any(rows == 1 and n >= 3 for rows, n in observer.steps)


def test_cancelling_running_requests_ends_them_early_and_frees_their_kv():
    """Rule: cancel ends a running request at once, wherever it is. Catches a cancel of a running
    request that is a no-op (the request would run to max_tokens and end 'length')."""
    with TokenRouter.from_config(_config(1, max_wait_ms=5, base_ms=5.0)) as engine:
        handles = [engine.submit([3 + i, 7, 9], max_tokens=400) for i in range(4)]
        deadline = time.monotonic() + 30
        while not all(h.token_ids for h in handles) and time.monotonic() < deadline:
            time.sleep(0.005)
        for handle in handles:
            handle.cancel()
        results = [handle.wait(30) for handle in handles]
        assert [r.finish_reason for r in results] == ["cancelled"] * 4
        assert all(1 <= len(r.token_ids) < 400 for r in results), [len(r.token_ids) for r in results]
        deadline = time.monotonic() + 10
        while (any(engine.kv_blocks_used().values()) or any(engine.held_requests().values())) \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        assert set(engine.kv_blocks_used().values()) == {0} and set(engine.held_requests().values()) == {0}
