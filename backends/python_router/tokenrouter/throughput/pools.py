"""Model pools: several instances (workers) of each model sharing N requests, and how to size them.

A request is pinned, for its whole life, to one instance of every model: the entry instance that
admitted it and the large-model instance the entry chose for it. Both are chosen least loaded (by
pinned requests) at admission, ties to the lowest index. With requests that all arrive at once and
never leave (the closed loop of the throughput model) that is round robin: request r sits on
instance ``r % w_j`` of model j.

Pinning couples the instances: request r ties its entry instance to its large-model instance. The
instances fall apart into ``gcd(w_0, .., w_{M-1})`` independent groups; when every model has the same
number of instances each group is one instance per model, i.e. a plain pair, and the Markov chain of
``model.py`` applies to it with its share of the requests. Every other split is predicted by the
discrete-event simulation (``montecarlo.simulate(workers=...)``), which follows each request.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from itertools import product
from typing import Sequence

import numpy as np

from .chain import compositions
from .inputs import Latency, check_matrices, check_pool_thresholds, check_population, check_workers
from .model import CoarseGridWarning, Matrix, predict
from .montecarlo import simulate


def splits_of(budget: int, M: int) -> list[tuple[int, ...]]:
    """Every way to give ``budget`` workers to M models with at least one each."""
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < M:
        raise ValueError(f"a worker budget must be an integer >= {M} (one worker per model), got {budget!r}")
    return [tuple(1 + x for x in extra) for extra in compositions(int(budget) - M, M)]


@dataclass(frozen=True)
class PoolPrediction:
    workers: tuple[int, ...]  # instances per model
    B: tuple[int, ...]  # the threshold of every instance of each model
    simulated: float  # tokens/s, discrete-event simulation
    chain: float | None  # tokens/s from the Markov chain, where the pools are independent pairs

    @property
    def per_worker(self) -> float:
        return self.simulated / sum(self.workers)


def predict_pools(P: Matrix, C: Matrix, L: Sequence[Latency], B: Sequence[int], N: int, workers: Sequence[int],
                  *, delta: float | None = None, snap: bool = False, events: int = 100_000, seed: int = 0,
                  handoff_s: float = 0.0) -> PoolPrediction:
    """Throughput of ``workers[j]`` instances of model j sharing N pinned requests.

    ``delta`` (the chain's grid) adds the chain's number where the pools are independent pairs."""
    p, c = check_matrices(P, C)
    N = check_population(N)
    workers = check_workers(workers, len(p), N)
    B = check_pool_thresholds(B, workers, N)
    simulated = simulate(p, c, L, B, N, events=events, seed=seed, handoff_s=handoff_s, workers=workers)
    chain = _pairs_chain(p, c, L, B, N, workers, delta, snap, handoff_s) if delta is not None else None
    return PoolPrediction(workers, B, simulated, chain)


def _pairs_chain(p: np.ndarray, c: np.ndarray, L: Sequence[Latency], B: tuple[int, ...], N: int,
                 workers: tuple[int, ...], delta: float, snap: bool, handoff_s: float) -> float | None:
    """The chain's throughput where every model has as many workers (independent pairs), else None."""
    if len(set(workers)) != 1:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CoarseGridWarning)  # a rounded grid is fine for a sizing table
        return sum(predict(p, c, L, B, len(range(group, N, workers[0])), delta, snap=snap, handoff_s=handoff_s)
                   for group in range(workers[0]))


def best_split(P: Matrix, C: Matrix, L: Sequence[Latency], B: Sequence[int], N: int, budget: int, *,
               search_B: int = 0, delta: float | None = None, snap: bool = False, events: int = 100_000,
               seed: int = 0, handoff_s: float = 0.0) -> tuple[tuple[int, ...], list[PoolPrediction]]:
    """The split of ``budget`` workers over the models with the highest simulated throughput, and
    every split's prediction. Each split runs ``B``, or with ``search_B`` the best of every B in
    {1..search_B}^M that it can run (ties to the smaller thresholds). Thresholds a split could
    deadlock with are skipped, and a split with none left is left out. Every run uses the same
    random seed, so differences between splits are not noise between runs."""
    p, c = check_matrices(P, C)
    N = check_population(N)
    if isinstance(search_B, bool) or not isinstance(search_B, (int, np.integer)) or search_B < 0:
        raise ValueError(f"search_B must be an integer >= 0 (0: no search), got {search_B!r}")
    candidates = list(product(range(1, search_B + 1), repeat=len(p))) if search_B > 0 else [tuple(B)]
    predictions = []
    for workers in splits_of(budget, len(p)):
        if any(w > N for w in workers):
            continue
        best_here: PoolPrediction | None = None
        for thresholds in candidates:
            try:
                check_pool_thresholds(thresholds, workers, N)
            except ValueError:
                continue
            prediction = predict_pools(p, c, L, thresholds, N, workers, events=events, seed=seed, handoff_s=handoff_s)
            if best_here is None or prediction.simulated > best_here.simulated:
                best_here = prediction
        if best_here is not None:
            chain = _pairs_chain(p, c, L, best_here.B, N, best_here.workers, delta, snap, handoff_s) \
                if delta is not None else None
            predictions.append(replace(best_here, chain=chain))
    if not predictions:
        tried = f"any B up to {search_B}" if search_B > 0 else f"B = {list(B)}"
        raise ValueError(f"no split of {budget} workers can run {tried} at N = {N} without deadlock")
    best = max(predictions, key=lambda prediction: prediction.simulated)
    return best.workers, predictions
