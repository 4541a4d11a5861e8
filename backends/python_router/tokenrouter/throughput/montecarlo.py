"""A discrete-event simulation of delayed batching, independent of the Markov chain.

It follows requests one by one (each completed row draws its own destination) on an integer
nanosecond clock, with no grid, no state encoding and no linear algebra, so agreement with
``predict`` checks the chain's construction and its stationary solve. It also models what the chain
cannot: a per-handoff latency, during which a row is on its way between two servers.
"""

from __future__ import annotations

import heapq
from typing import Sequence

import numpy as np

from .inputs import Latency, check_matrices, check_population, check_thresholds, latency_table


def simulate(P: Sequence[Sequence[float]] | np.ndarray, C: Sequence[Sequence[float]] | np.ndarray,
             L: Sequence[Latency], B: Sequence[int], N: int, *, events: int = 100_000,
             warmup: int = 1_000, seed: int = 0, handoff_s: float = 0.0) -> float:
    """Committed tokens per second over ``events`` batch completions after ``warmup`` ones.

    ``handoff_s``: a row that moves to another model reaches it that much later (a network between
    two servers); it is in neither model's queue meanwhile, and both models go on."""
    p, c = check_matrices(P, C)
    N = check_population(N)
    B = check_thresholds(B, len(p), N)
    if handoff_s < 0:
        raise ValueError(f"handoff_s must be >= 0, got {handoff_s}")
    nanos = np.rint(latency_table(L, len(p), N) * 1e9).astype(np.int64)
    transit_ns = int(round(handoff_s * 1e9))
    M = len(p)
    rng = np.random.default_rng(seed)
    cumulative = np.cumsum(p, axis=1)
    waiting = [N] + [0] * (M - 1)  # all requests start at the entry model
    running = [0] * M
    finish: list[int | None] = [None] * M
    in_transit: list[tuple[int, int]] = []  # heap of (arrival time, destination model)
    now = measured_from = 0
    tokens = 0.0
    completions = 0
    while completions < warmup + events:
        for j in range(M):  # idle models whose queue reached the threshold start everything waiting
            if finish[j] is None and waiting[j] >= B[j]:
                running[j], waiting[j] = waiting[j], 0
                finish[j] = now + int(nanos[j, running[j] - 1])
        next_finish = min((t for t in finish if t is not None), default=None)
        if in_transit and (next_finish is None or in_transit[0][0] < next_finish):
            now, model = heapq.heappop(in_transit)  # a handed-off row arrives
            waiting[model] += 1
            continue
        if completions == warmup:
            tokens, measured_from = 0.0, now
        completions += 1
        now = next_finish
        for i in range(M):
            if finish[i] != now:
                continue
            destinations = np.minimum(np.searchsorted(cumulative[i], rng.random(running[i]), side="right"), M - 1)
            for j in destinations.tolist():
                tokens += c[i, j]
                if j == i or transit_ns == 0:
                    waiting[j] += 1
                else:
                    heapq.heappush(in_transit, (now + transit_ns, j))
            running[i], finish[i] = 0, None
    return tokens / ((now - measured_from) * 1e-9)
