"""Delayed-batching thresholds for TokenRouter runs, chosen by the throughput model.

Inputs: the routing matrices of the ``random`` policy (known exactly) and each model's step
latency per batch size: the profile's own numbers on the simulated engine, a short measurement
on a real engine. Output: B* for every active count N = 1..max, as the per-N lists the config's
``batch_threshold`` takes.
"""

from __future__ import annotations

import time
from functools import lru_cache

import numpy as np

from tokenrouter.engine.base import Engine, StepRow
from tokenrouter.engine.simulated import SimulatedEngine
from tokenrouter.throughput import best_thresholds

Matrices = tuple[list[list[float]], list[list[float]]]


def random_routing(rate: float) -> Matrices:
    """P and C of the random policy: small -> large with ``rate``, the small token there dropped;
    the large model writes one token and hands back."""
    return [[1.0 - rate, rate], [1.0, 0.0]], [[1.0, 0.0], [1.0, 0.0]]


def step_latencies(engine: Engine, max_batch: int, *, prompt_len: int = 16, samples: int = 2) -> list[float]:
    """Seconds per decode step at batch sizes 1..max_batch.

    Simulated: the profile's latency. Real: median of ``samples`` timed decode steps at batch
    1, the middle and ``max_batch``, linear in between (decode cost is close to linear in rows).
    """
    if isinstance(engine, SimulatedEngine):
        return [engine.profile.step_ms(b, b) / 1e3 for b in range(1, max_batch + 1)]
    sizes = sorted({1, max(1, max_batch // 2), max_batch})
    measured = [_timed_decode(engine, b, prompt_len, samples) for b in sizes]
    return list(np.interp(range(1, max_batch + 1), sizes, measured))


def _timed_decode(engine: Engine, batch: int, prompt_len: int, samples: int) -> float:
    ids = [f"calibrate-{i}" for i in range(batch)]
    prompt = list(range(1, prompt_len + 1))
    for seq_id in ids:
        engine.add_sequence(seq_id)
    try:
        result = engine.step([StepRow(seq_id, prompt) for seq_id in ids])
        times = []
        for _ in range(samples):
            start = time.perf_counter()
            result = engine.step([StepRow(s, [t]) for s, t in zip(ids, result.sampled.tolist())])
            times.append(time.perf_counter() - start)
    finally:
        for seq_id in ids:
            engine.release(seq_id)
    return float(np.median(times))


def thresholds_by_n(rate: float, latencies: list[list[float]], max_active: int) -> list[list[int]]:
    """B* per model as lists indexed by N - 1 (the config's per-N form)."""
    best = _best(rate, tuple(tuple(round(x, 7) for x in row[:max_active]) for row in latencies), max_active)
    return [[best[n][i] for n in range(1, max_active + 1)] for i in range(len(latencies))]


@lru_cache(maxsize=32)
def _best(rate: float, latencies: tuple[tuple[float, ...], ...], max_active: int) -> dict[int, list[int]]:
    P, C = random_routing(rate)
    delta = max(max(row) for row in latencies) / 100  # the grid `auto` uses: cheap, and B* is robust to it
    best, _ = best_thresholds(P, C, [list(row) for row in latencies], range(1, max_active + 1), delta, snap=True)
    return best
