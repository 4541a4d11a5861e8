"""Throughput of delayed batching, T(B), and the best thresholds B* (TokenRouter, Appendix D).

    T(B) = sum_s pi(s) sum_{i in A(s)} sum_j b_i p_ij c_ij  /  sum_s pi(s) tau(s)

where pi is the stationary distribution of the chain in ``chain.py`` (a renewal-reward ratio:
expected tokens per completion event over expected time per event).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from itertools import product
from typing import Iterable, Sequence, overload

import numpy as np
from scipy import sparse
from scipy.sparse import csgraph
from scipy.sparse.linalg import bicgstab, spsolve

from .chain import Chain, StateSpaceTooLarge, build_chain
from .inputs import Grid, Latency, check_matrices, check_population, check_thresholds, latency_table, make_grid
from .prefill import PrefillCosts, charged

Matrix = Sequence[Sequence[float]] | np.ndarray

# Reachable states allowed before the grid is coarsened. About 1-2 s of build and solve on one
# CPU core (see docs/throughput.md).
DEFAULT_MAX_STATES = 60_000
_RTOL = 1e-12  # relative residual of the stationary solve
_MAXITER = 2000  # BiCGSTAB iterations before the direct solve takes over (~1 s at 40k states)


class CoarseGridWarning(UserWarning):
    """The requested delta gave too many states; a coarser grid (rounded latencies) was used."""


@dataclass(frozen=True)
class Prediction:
    throughput: float  # committed tokens per second
    num_states: int  # reachable states of the chain
    unit_s: float  # grid unit actually used (delta times the gcd reduction, or coarsened)
    steps: tuple[tuple[int, ...], ...]  # latencies in grid units, per model and batch size
    seconds: float  # wall time of the build and solve


def stationary(transition: sparse.csr_matrix) -> np.ndarray:
    """pi with pi T = pi, sum pi = 1, supported on the chain's single closed class.

    States visited only on the way from the start (transient ones) get probability 0. Solving on
    the closed class alone keeps the linear system non-singular.
    """
    n = transition.shape[0]
    count, labels = csgraph.connected_components(transition, directed=True, connection="strong")
    coo = transition.tocoo()
    leaving = np.unique(labels[coo.row[labels[coo.row] != labels[coo.col]]])
    closed = np.setdiff1d(np.arange(count), leaving)
    if len(closed) != 1:
        raise ValueError(f"the chain has {len(closed)} closed classes; the long-run throughput "
                         f"depends on the start and the model does not cover it")
    members = np.flatnonzero(labels == closed[0])
    # pi (I - T) = 0 with pi_0 fixed to 1: drop state 0's balance equation and move its column to
    # the right-hand side. (Replacing an equation by sum(pi) = 1 would add a dense row.)
    system = (sparse.identity(len(members)) - transition[members][:, members]).T.tocsc()
    weights = np.ones(len(members))
    if len(members) > 1:
        weights[1:] = _linear_solve(system[1:, 1:], -system[1:, 0].toarray().ravel())
    pi = np.zeros(n)
    pi[members] = weights / weights.sum()
    return pi


def _linear_solve(matrix: sparse.csc_matrix, rhs: np.ndarray) -> np.ndarray:
    """BiCGSTAB first: 2-3x faster than sparse LU here, whose fill-in varies a lot between
    thresholds. Its answer is kept only if the residual is tiny; otherwise the direct solve."""
    rows = matrix.tocsr()
    solution, info = bicgstab(rows, rhs, rtol=_RTOL, maxiter=_MAXITER)
    if info == 0 and np.linalg.norm(rows @ solution - rhs) <= 10 * _RTOL * np.linalg.norm(rhs) \
            and solution.min() >= -1e-9 * solution.max():
        return solution
    return spsolve(matrix, rhs)


def chain_throughput(chain: Chain, unit_s: float) -> float:
    pi = stationary(chain.transition)
    return float(pi @ chain.reward) / (float(pi @ chain.holding) * unit_s)


def solve(P: Matrix, C: Matrix, L: Sequence[Latency], B: Sequence[int], N: int, delta: float, *,
          snap: bool = False, max_states: int = DEFAULT_MAX_STATES, handoff_s: float = 0.0,
          prefill: PrefillCosts | None = None) -> Prediction:
    """T(B) with diagnostics. L[i] is seconds, or a list of seconds per batch size 1..N.

    Latencies must be whole multiples of ``delta`` unless ``snap`` rounds them to the grid. When
    the chain would exceed ``max_states`` states, the grid unit is doubled and latencies are
    rounded to it until it fits; a ``CoarseGridWarning`` says so. ``handoff_s``: see ``with_handoff``.
    ``prefill``: L are decode steps, and every row is charged its expected prefill/extend cost on top
    (``prefill.py``); the charged latencies are rarely grid multiples, so pass ``snap`` with it.
    """
    p, c = check_matrices(P, C)
    N = check_population(N)
    B = check_thresholds(B, len(p), N)
    latencies = step_latencies(L, p, c, N, handoff_s, prefill)
    return _solve_on(p, c, latencies, make_grid(latencies, delta, snap), B, N, max_states)


def predict(P: Matrix, C: Matrix, L: Sequence[Latency], B: Sequence[int], N: int, delta: float, *,
            snap: bool = False, handoff_s: float = 0.0, prefill: PrefillCosts | None = None) -> float:
    """Predicted decoding throughput in committed tokens per second (Appendix D)."""
    return solve(P, C, L, B, N, delta, snap=snap, handoff_s=handoff_s, prefill=prefill).throughput


def step_latencies(L: Sequence[Latency], p: np.ndarray, c: np.ndarray, N: int, handoff_s: float,
                   prefill: PrefillCosts | None) -> np.ndarray:
    """The chain's M x N step latencies: decode steps, plus the expected prefill/extend charges, plus handoffs."""
    return with_handoff(charged(latency_table(L, len(p), N), p, c, prefill), p, handoff_s)


def with_handoff(latencies: np.ndarray, p: np.ndarray, handoff_s: float) -> np.ndarray:
    """The chain's view of a per-handoff latency (models on different servers): added to the step of
    every model whose rows may leave it, as if its step's results reached the other model that much
    later. The chain has no state for a row in transit, so this also delays the rows that stay and
    keeps the model busy meanwhile: an upper bound on the cost when most rows stay.
    ``montecarlo.simulate(handoff_s=...)`` follows each handed-off row instead."""
    if handoff_s < 0:
        raise ValueError(f"handoff_s must be >= 0, got {handoff_s}")
    return latencies + handoff_s * (np.diag(p) < 1)[:, None]


def feasible_thresholds(M: int, N: int) -> Iterable[tuple[int, ...]]:
    """Every B in {1..N}^M that cannot deadlock: sum(B_i - 1) < N."""
    return (B for B in product(range(1, N + 1), repeat=M) if sum(b - 1 for b in B) < N)


@overload
def best_thresholds(P: Matrix, C: Matrix, L: Sequence[Latency], N: int, delta: float, *, snap: bool = ...,
                    max_states: int = ..., yield_gil: bool = ..., handoff_s: float = ...,
                    prefill: PrefillCosts | None = ...) -> tuple[list[int], dict[tuple[int, ...], float]]: ...
@overload
def best_thresholds(P: Matrix, C: Matrix, L: Sequence[Latency], N: Iterable[int], delta: float, *,
                    snap: bool = ..., max_states: int = ..., yield_gil: bool = ..., handoff_s: float = ...,
                    prefill: PrefillCosts | None = ...
                    ) -> tuple[dict[int, list[int]], dict[int, dict[tuple[int, ...], float]]]: ...
def best_thresholds(P, C, L, N, delta, *, snap=False, max_states=DEFAULT_MAX_STATES, yield_gil=False, handoff_s=0.0,
                    prefill=None):
    """B* = argmax T(B) over feasible B, and the table B -> T(B).

    With an iterable of N (e.g. ``range(1, 17)``), returns ``({N: B*}, {N: table})``. Ties go to
    the smaller thresholds (less waiting for the same throughput). ``yield_gil``: see ``build_chain``.
    """
    if isinstance(N, Iterable):
        per_n = {n: best_thresholds(P, C, L, n, delta, snap=snap, max_states=max_states, yield_gil=yield_gil,
                                    handoff_s=handoff_s, prefill=prefill) for n in N}
        return {n: best for n, (best, _) in per_n.items()}, {n: table for n, (_, table) in per_n.items()}
    p, c = check_matrices(P, C)
    N = check_population(N)
    latencies = step_latencies(L, p, c, N, handoff_s, prefill)
    grid = make_grid(latencies, delta, snap)
    table: dict[tuple[int, ...], float] = {}
    for B in feasible_thresholds(len(p), N):
        prediction = _solve_on(p, c, latencies, grid, B, N, max_states, yield_gil)
        grid = _grid_of(prediction)  # keep a coarsened grid for the rest of the sweep
        table[B] = prediction.throughput
    best = max(table, key=lambda B: (round(table[B], 9), [-b for b in B]))
    return list(best), table


def _solve_on(p: np.ndarray, c: np.ndarray, latencies: np.ndarray, grid: Grid, B: tuple[int, ...],
              N: int, max_states: int, yield_gil: bool = False) -> Prediction:
    started = time.perf_counter()
    while True:
        try:
            chain = build_chain(p, c, grid, B, N, max_states, yield_gil=yield_gil)
            break
        except StateSpaceTooLarge:
            if grid.max_steps <= 1:
                raise ValueError(f"N = {N} with M = {len(p)} models has more than {max_states} states "
                                 f"even on the coarsest grid; raise max_states") from None
            coarser = make_grid(latencies, grid.unit_s * 2, snap=True)
            warnings.warn(CoarseGridWarning(
                f"more than {max_states} states with grid unit {grid.unit_s * 1e3:.4g} ms (latency "
                f"steps {grid.steps}); retrying with unit {coarser.unit_s * 1e3:.4g} ms and rounded "
                f"latencies {coarser.steps}"), stacklevel=3)
            grid = coarser
    return Prediction(chain_throughput(chain, grid.unit_s), len(chain.states), grid.unit_s, grid.steps,
                      time.perf_counter() - started)


def _grid_of(prediction: Prediction) -> Grid:
    return Grid(prediction.unit_s, prediction.steps)
