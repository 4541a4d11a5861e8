"""A discrete-event simulation of delayed batching, independent of the Markov chain.

It follows requests one by one (each completed row draws its own destination) on an integer
nanosecond clock, with no grid, no state encoding and no linear algebra, so agreement with
``predict`` checks the chain's construction and its stationary solve.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .inputs import Latency, check_matrices, check_population, check_thresholds, latency_table


def simulate(P: Sequence[Sequence[float]] | np.ndarray, C: Sequence[Sequence[float]] | np.ndarray,
             L: Sequence[Latency], B: Sequence[int], N: int, *, events: int = 100_000,
             warmup: int = 1_000, seed: int = 0) -> float:
    """Committed tokens per second over ``events`` batch completions after ``warmup`` ones."""
    p, c = check_matrices(P, C)
    N = check_population(N)
    B = check_thresholds(B, len(p), N)
    nanos = np.rint(latency_table(L, len(p), N) * 1e9).astype(np.int64)
    M = len(p)
    rng = np.random.default_rng(seed)
    cumulative = np.cumsum(p, axis=1)
    waiting = [N] + [0] * (M - 1)  # all requests start at the entry model
    running = [0] * M
    finish: list[int | None] = [None] * M
    now = measured_from = 0
    tokens = 0.0
    for event in range(warmup + events):
        for j in range(M):  # idle models whose queue reached the threshold start everything waiting
            if finish[j] is None and waiting[j] >= B[j]:
                running[j], waiting[j] = waiting[j], 0
                finish[j] = now + int(nanos[j, running[j] - 1])
        if event == warmup:
            tokens, measured_from = 0.0, now
        now = min(t for t in finish if t is not None)
        for i in range(M):
            if finish[i] != now:
                continue
            destinations = np.minimum(np.searchsorted(cumulative[i], rng.random(running[i]), side="right"), M - 1)
            for j in destinations.tolist():
                tokens += c[i, j]
                waiting[j] += 1
            running[i], finish[i] = 0, None
    return tokens / ((now - measured_from) * 1e-9)
