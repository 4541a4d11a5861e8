"""AutoThresholds: online estimates, background solves on drift only, the deadlock guard, cheap calls."""

from __future__ import annotations

import random
import threading
import time
from typing import Iterator

import numpy as np
import pytest

from tokenrouter.throughput import best_thresholds
from tokenrouter.throughput.chain import build_chain
from tokenrouter.throughput.inputs import latency_table, make_grid
from tokenrouter.throughput.online import AUTO_STEPS, AutoThresholds

SOLVE_TIMEOUT = 120  # seconds; solves for N <= 4 take well under one on an idle core


@pytest.fixture
def auto() -> Iterator[AutoThresholds]:
    thresholds = AutoThresholds(["slm", "llm"], max_active=4, min_samples=50, drift=0.1, poll_s=0.02)
    yield thresholds
    thresholds.close()


def feed(auto: AutoThresholds, steps: int, *, p: float = 0.35, llm_ms: float = 27.9, seed: int = 0) -> None:
    """Synthetic steps of the paper's R2R pair: SLM rows leave with probability p (token dropped),
    LLM rows always return with one token; latencies with a mild batch slope and noise."""
    rng = random.Random(seed)
    for _ in range(steps):
        batch = rng.randint(1, 4)
        auto.observe_step(0, batch, (5.9 + 0.1 * batch) * 1e-3 * rng.uniform(0.98, 1.02))
        auto.observe_step(1, batch, (llm_ms - 0.4 + 0.4 * batch) * 1e-3 * rng.uniform(0.98, 1.02))
        leave = [1 if rng.random() < p else 0 for _ in range(batch)]
        auto.observe_routes(0, leave, [1 - d for d in leave])
        auto.observe_routes(1, [0] * batch, [1] * batch)


def test_all_ones_until_enough_samples(auto: AutoThresholds) -> None:
    feed(auto, 10)
    time.sleep(0.2)
    assert not auto.estimates().ready
    assert auto.generation == 0
    assert [auto.thresholds(n) for n in range(1, 5)] == [[1, 1]] * 4


def test_estimates_follow_the_observations(auto: AutoThresholds) -> None:
    feed(auto, 3000)
    estimates = auto.estimates()
    assert estimates.ready
    assert estimates.P[0, 1] == pytest.approx(0.35, abs=0.02)
    assert estimates.P[1].tolist() == [1.0, 0.0]
    assert estimates.C.tolist() == [[1.0, 0.0], [1.0, 0.0]]
    # Per-batch-size latencies: 6.0, 6.1, 6.2, 6.3 ms on the SLM, within the noise.
    assert estimates.L[0] == pytest.approx([6.0e-3, 6.1e-3, 6.2e-3, 6.3e-3], rel=0.01)


def test_solves_in_the_background_to_the_paper_thresholds(auto: AutoThresholds) -> None:
    feed(auto, 3000)
    assert auto.wait_for(1, SOLVE_TIMEOUT), auto.last_error
    assert [auto.thresholds(n) for n in (2, 3, 4)] == [[1, 2], [1, 2], [1, 3]]
    # Exactly what the offline search gives on the same estimates and grid.
    estimates = auto.estimates()
    best, _ = best_thresholds(estimates.P, estimates.C, list(estimates.L), 4, estimates.L.max() / AUTO_STEPS, snap=True)
    assert auto.thresholds(4) == best


def test_resolves_only_on_drift(auto: AutoThresholds) -> None:
    feed(auto, 3000)
    assert auto.wait_for(1, SOLVE_TIMEOUT), auto.last_error
    feed(auto, 500, seed=1)  # same system, fresh noise
    time.sleep(0.3)  # many polls
    assert auto.generation == 1
    feed(auto, 600, llm_ms=60.0, seed=2)  # the LLM got much slower: wait for bigger LLM batches
    assert auto.wait_for(2, SOLVE_TIMEOUT), auto.last_error
    deadline = time.monotonic() + SOLVE_TIMEOUT  # a poll may have caught the estimates half-way
    while auto.thresholds(4) != [1, 4] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert auto.thresholds(4) == [1, 4]


def test_thresholds_never_deadlock(auto: AutoThresholds) -> None:
    feed(auto, 3000, p=0.6)
    assert auto.wait_for(1, SOLVE_TIMEOUT), auto.last_error
    for active in range(0, 12):
        B = auto.thresholds(active)
        assert sum(b - 1 for b in B) < max(active, 1)


def test_decoding_loop_calls_stay_cheap_during_a_solve() -> None:
    auto = AutoThresholds(["slm", "llm"], max_active=8, min_samples=50, poll_s=0.02)
    try:
        feed(auto, 2000)
        durations = []
        deadline = time.monotonic() + SOLVE_TIMEOUT
        while auto.generation == 0 and time.monotonic() < deadline:
            started = time.perf_counter()
            auto.observe_step(0, 2, 6.1e-3)
            auto.observe_routes(0, [0, 1], [1, 0])
            auto.thresholds(8)
            durations.append(time.perf_counter() - started)
            time.sleep(0.001)
        assert auto.generation == 1 and len(durations) > 20
        # The solver never holds the lock for a solve; a call waits at most for a GIL hand-off.
        assert np.median(durations) < 1e-3
    finally:
        auto.close()


def _wake_up_delays(yield_gil: bool) -> list[float]:
    """How late a thread sleeping 1 ms at a time wakes up while chains are built next to it (the
    pure-Python part of a solve, the part that holds the GIL)."""
    grid = make_grid(latency_table([6.1e-3, 27.9e-3], 2, 10), 1e-4)
    done = threading.Event()

    def solver() -> None:
        for B in ((1, 1), (1, 2), (2, 2)):
            build_chain(np.array([[0.65, 0.35], [1, 0]]), np.eye(2), grid, B, 10, 10**6, yield_gil=yield_gil)
        done.set()

    thread = threading.Thread(target=solver)
    thread.start()
    delays = []
    while not done.is_set():
        started = time.perf_counter()
        time.sleep(0.001)
        delays.append(time.perf_counter() - started - 0.001)
    thread.join()
    return delays


def test_the_solver_thread_lets_decoding_threads_in() -> None:
    # Without yielding, a woken thread waits for the GIL up to the 5 ms switch interval.
    assert np.median(_wake_up_delays(True)) < 0.5 * np.median(_wake_up_delays(False))


def test_close_stops_the_thread(auto: AutoThresholds) -> None:
    auto.close()
    assert not auto._thread.is_alive()


@pytest.mark.parametrize("kwargs", [dict(models=[]), dict(max_active=0), dict(delta=-1.0), dict(drift=0.0),
                                    dict(min_samples=0)])
def test_bad_arguments(kwargs) -> None:
    with pytest.raises(ValueError):
        AutoThresholds(**(dict(models=["a", "b"], max_active=4) | kwargs))


def test_bad_observations(auto: AutoThresholds) -> None:
    with pytest.raises(ValueError):
        auto.observe_step(0, 0, 1e-3)
    with pytest.raises(ValueError):
        auto.observe_step(0, 1, float("nan"))
    with pytest.raises(ValueError):
        auto.observe_routes(0, [0, 1], [1])
