"""Inputs of the throughput model: validation and the integer time grid.

The chain only ever needs step latencies as whole numbers of grid steps. Every time-left value is
a step latency minus a sum of holding times, so all of them are multiples of the gcd of the
latencies in steps: the grid delta * gcd gives exactly the same chain with fewer states. That
reduction is free; rounding latencies to a grid (``snap``, or the coarsening in ``model.py`` when
the state space would explode) changes the chain slightly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, Union

import numpy as np

# A model's step latency in seconds: one number, or one per batch size (index b - 1 for batch b).
Latency = Union[float, Sequence[float]]

_ROW_TOL = 1e-6  # rows of P must sum to 1 within this
_GRID_TOL = 1e-6  # L / delta must be this close to an integer (relative to the quotient)


@dataclass(frozen=True)
class Grid:
    """Step latencies in whole grid units: ``steps[i][b - 1]`` for model i at batch size b."""

    unit_s: float  # seconds per unit
    steps: tuple[tuple[int, ...], ...]

    @property
    def max_steps(self) -> int:
        return max(max(row) for row in self.steps)


def check_matrices(P: Sequence[Sequence[float]] | np.ndarray,
                   C: Sequence[Sequence[float]] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """P (routing probabilities, rows sum to 1) and C (committed tokens), both M x M, M >= 1."""
    p = np.asarray(P, dtype=float)
    c = np.asarray(C, dtype=float)
    if p.ndim != 2 or p.shape[0] != p.shape[1] or p.shape[0] < 1:
        raise ValueError(f"P must be a square M x M matrix, got shape {p.shape}")
    if c.shape != p.shape:
        raise ValueError(f"C must have the shape of P {p.shape}, got {c.shape}")
    if not (np.isfinite(p).all() and np.isfinite(c).all()):
        raise ValueError("P and C must be finite")
    if (p < 0).any() or (p > 1).any():
        raise ValueError(f"routing probabilities must lie in [0, 1], got P = {p.tolist()}")
    if (c < 0).any():
        raise ValueError(f"committed tokens must be >= 0, got C = {c.tolist()}")
    sums = p.sum(axis=1)
    bad = [i for i, s in enumerate(sums) if abs(s - 1.0) > _ROW_TOL]
    if bad:
        raise ValueError(f"each row of P must sum to 1 (p_ii is the stay probability); "
                         f"rows {bad} sum to {[float(sums[i]) for i in bad]}")
    return p / sums[:, None], c


def check_population(N: int) -> int:
    if isinstance(N, bool) or not isinstance(N, (int, np.integer)) or N < 1:
        raise ValueError(f"N (concurrent requests) must be an integer >= 1, got {N!r}")
    return int(N)


def check_thresholds(B: Sequence[int], M: int, N: int) -> tuple[int, ...]:
    """B_i in 1..N with the deadlock guard sum(B_i - 1) < N."""
    thresholds = tuple(B)
    if len(thresholds) != M:
        raise ValueError(f"B needs one threshold per model ({M}), got {len(thresholds)}")
    if any(isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1 for b in thresholds):
        raise ValueError(f"thresholds must be integers >= 1, got B = {list(thresholds)}")
    slack = sum(b - 1 for b in thresholds)
    if slack >= N:
        raise ValueError(f"B = {list(thresholds)} can deadlock at N = {N}: sum(B_i - 1) = {slack} >= N "
                         f"(every model may hold fewer requests than its threshold)")
    return tuple(int(b) for b in thresholds)


def check_workers(workers: Sequence[int], M: int, N: int) -> tuple[int, ...]:
    """One instance count >= 1 per model, none above N (an instance with no request never runs)."""
    counts = tuple(workers)
    if len(counts) != M:
        raise ValueError(f"workers needs one instance count per model ({M}), got {len(counts)}")
    if any(isinstance(w, bool) or not isinstance(w, (int, np.integer)) or not 1 <= w <= N for w in counts):
        raise ValueError(f"each model needs between 1 and N = {N} instances, got workers = {list(counts)}")
    return tuple(int(w) for w in counts)


def placement(N: int, workers: Sequence[int]) -> np.ndarray:
    """N x M: the instance of model j that request r is pinned to (least loaded at admission)."""
    return np.array([[r % w for w in workers] for r in range(N)], dtype=int).reshape(N, len(workers))


def check_pool_thresholds(B: Sequence[int], workers: Sequence[int], N: int) -> tuple[int, ...]:
    """Thresholds every instance can reach: B_i at most the requests pinned to the least loaded
    instance of model i (else it never starts and its requests stay there), and the deadlock guard
    per group of instances that share requests: sum over the group's instances of (B_i - 1) < the
    group's requests. With one instance per model that is the pair's rule sum(B_i - 1) < N."""
    thresholds = check_thresholds(B, len(workers), N)
    for model, (w, b) in enumerate(zip(workers, thresholds)):
        if b > N // w:
            raise ValueError(f"B[{model}] = {b} but an instance of model {model} holds only {N // w} of the N = {N} "
                             f"requests with workers = {list(workers)}: it would never start")
    groups = math.gcd(*workers)
    for group in range(groups):
        requests = len(range(group, N, groups))
        slack = sum((w // groups) * (b - 1) for w, b in zip(workers, thresholds))
        if slack >= requests:
            raise ValueError(f"B = {list(thresholds)} can deadlock with workers = {list(workers)} at N = {N}: "
                             f"a group of {[w // groups for w in workers]} instances shares {requests} requests "
                             f"and its sum of (B_i - 1) is {slack} >= {requests}")
    return thresholds


def latency_table(L: Sequence[Latency], M: int, N: int) -> np.ndarray:
    """An M x N table of step latencies in seconds (column b - 1 = batch size b)."""
    if len(L) != M:
        raise ValueError(f"L needs one latency per model ({M}), got {len(L)}")
    table = np.empty((M, N))
    for i, entry in enumerate(L):
        if np.ndim(entry) == 0:
            table[i, :] = float(np.asarray(entry))  # the 0-d array of whatever scalar np.ndim saw
            continue
        values = np.asarray(entry, dtype=float)
        if values.ndim != 1 or len(values) < N:
            raise ValueError(f"L[{i}] per batch size needs at least N = {N} values, got {len(values)}")
        table[i, :] = values[:N]
    if not (np.isfinite(table).all() and (table > 0).all()):
        raise ValueError(f"step latencies must be finite and > 0 seconds, got L = {table.tolist()}")
    return table


def make_grid(latencies: np.ndarray, delta: float, snap: bool = False) -> Grid:
    """The grid for step ``delta``: latencies must be whole multiples of it, unless ``snap``
    rounds them to the nearest multiple (at least one step). Reduced by the gcd either way."""
    if not (math.isfinite(delta) and delta > 0):
        raise ValueError(f"delta must be a finite time step > 0 seconds, got {delta!r}")
    quotients = latencies / delta
    steps = np.rint(quotients)
    if snap:
        return _reduced(np.maximum(steps, 1).astype(int), delta)
    off = (np.abs(quotients - steps) > _GRID_TOL * np.maximum(quotients, 1.0)) | (steps < 1)
    if off.any():
        i, b = map(int, np.argwhere(off)[0])
        raise ValueError(f"L[{i}] = {latencies[i, b]!r} s (batch {b + 1}) is not a whole multiple of "
                         f"delta = {delta!r} s; pick a delta that divides every latency, or snap to the grid")
    return _reduced(steps.astype(int), delta)


def _reduced(steps: np.ndarray, delta: float) -> Grid:
    g = math.gcd(*steps.ravel().tolist())
    return Grid(unit_s=delta * g, steps=tuple(tuple(int(s) // g for s in row) for row in steps))
