"""The discrete-time Markov chain of Appendix D, built by breadth-first search.

A state holds, per model i, (k_i waiting, b_i running batch size, r_i grid units left on that
batch), flattened as ``(k_0..k_{M-1}, b_0..b_{M-1}, r_0..r_{M-1})``; an idle model has b_i = r_i = 0.
The chain is sampled at batch completions: from state s the next event is after
tau(s) = min r_i over busy models, every model with r_i = tau(s) completes, its b_i requests split
over destinations by a multinomial with probabilities P[i], arrivals join the destination queues,
and each idle model whose queue reaches B_i starts a batch of all its waiting requests.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from itertools import product

import numpy as np
from scipy import sparse

from .inputs import Grid

State = tuple[int, ...]
_YIELD_EVERY = 128  # states between GIL releases, well under a millisecond of work


class StateSpaceTooLarge(RuntimeError):
    """The reachable states exceed the cap; the caller coarsens the grid and retries."""


@dataclass
class Chain:
    states: list[State]
    transition: sparse.csr_matrix  # row-stochastic, states x states
    holding: np.ndarray  # tau(s) in grid units
    reward: np.ndarray  # expected committed tokens of the batches completing in s


def splits(b: int, probs: np.ndarray) -> list[tuple[float, tuple[int, ...]]]:
    """All ways b requests can spread over destinations, with their multinomial probabilities.

    Destinations with probability 0 are skipped, so the count is C(b + d - 1, d - 1) for d
    reachable destinations.
    """
    targets = [j for j, p in enumerate(probs) if p > 0]
    out = []
    for counts in compositions(b, len(targets)):
        log_p = math.lgamma(b + 1) + sum(n * math.log(probs[j]) - math.lgamma(n + 1)
                                         for j, n in zip(targets, counts))
        arrivals = [0] * len(probs)
        for j, n in zip(targets, counts):
            arrivals[j] = n
        out.append((math.exp(log_p), tuple(arrivals)))
    return out


def compositions(total: int, parts: int):
    if parts == 1:
        yield (total,)
        return
    for first in range(total + 1):
        for rest in compositions(total - first, parts - 1):
            yield (first,) + rest


class _Builder:
    """Integer codes for states and the cached outcomes of completions.

    code = kb + W * rc, where kb encodes (k, b) in radix N + 1 and rc encodes r in radix
    (max latency steps + 1) per model. The outcomes of completions depend on (k, b) and on which
    models complete, not on r, so they are enumerated once per (kb, done) with the time left of
    still-running models left at 0; adding W * (their r - tau) gives the target's code.
    """

    def __init__(self, P: np.ndarray, C: np.ndarray, grid: Grid, B: tuple[int, ...], N: int) -> None:
        self.P, self.grid, self.B, self.N = P, grid, B, N
        self.M = len(B)
        self.tokens_per_request = (P * C).sum(axis=1)  # expected tokens one completed row commits
        self.W = (N + 1) ** (2 * self.M)
        self.r_radix = [max(row) + 1 for row in grid.steps]
        self.r_weight = [math.prod(self.r_radix[:j]) for j in range(self.M)]
        self._splits: dict[tuple[int, int], list[tuple[float, tuple[int, ...]]]] = {}
        self._moves: dict[tuple[int, tuple[int, ...]], tuple[list[int], list[float]]] = {}
        self._heads: dict[int, tuple[int, ...]] = {}

    def encode(self, k: list[int], b: list[int], r: list[int]) -> int:
        kb = 0
        for value in reversed(k + b):
            kb = kb * (self.N + 1) + value
        return kb + self.W * sum(x * w for x, w in zip(r, self.r_weight))

    def decode(self, code: int) -> State:
        kb, rc = code % self.W, code // self.W
        r = []
        for radix in self.r_radix:
            rc, x = divmod(rc, radix)
            r.append(x)
        return self.head(kb) + tuple(r)

    def head(self, kb: int) -> tuple[int, ...]:
        """(k_0..k_{M-1}, b_0..b_{M-1}) of a kb code."""
        if kb not in self._heads:
            fields, rest = [], kb
            for _ in range(2 * self.M):
                rest, x = divmod(rest, self.N + 1)
                fields.append(x)
            self._heads[kb] = tuple(fields)
        return self._heads[kb]

    def start(self, k: list[int], b: list[int], r: list[int]) -> None:
        """Idle models whose queue reached their threshold start a batch of everything waiting."""
        for j in range(self.M):
            if b[j] == 0 and k[j] >= self.B[j]:
                b[j], k[j] = k[j], 0
                r[j] = self.grid.steps[j][b[j] - 1]

    def initial(self) -> int:
        k, b, r = [self.N] + [0] * (self.M - 1), [0] * self.M, [0] * self.M
        self.start(k, b, r)
        return self.encode(k, b, r)

    def moves(self, kb: int, done: tuple[int, ...]) -> tuple[list[int], list[float]]:
        """Target codes (still-running models at r = 0) and probabilities when ``done`` complete."""
        key = (kb, done)
        if key not in self._moves:
            self._moves[key] = self._enumerate(self.head(kb), done)
        return self._moves[key]

    def _enumerate(self, head: tuple[int, ...], done: tuple[int, ...]) -> tuple[list[int], list[float]]:
        M = self.M
        codes: list[int] = []
        probs: list[float] = []
        for combo in product(*(self._split(i, head[M + i]) for i in done)):
            k, b = list(head[:M]), list(head[M:])
            r = [0] * M
            prob = 1.0
            for i, (p, arrivals) in zip(done, combo):
                prob *= p
                b[i] = 0
                for j, n in enumerate(arrivals):
                    k[j] += n
            self.start(k, b, r)
            codes.append(self.encode(k, b, r))
            probs.append(prob)
        return codes, probs

    def _split(self, i: int, b: int) -> list[tuple[float, tuple[int, ...]]]:
        if (i, b) not in self._splits:
            self._splits[(i, b)] = splits(b, self.P[i])
        return self._splits[(i, b)]


def build_chain(P: np.ndarray, C: np.ndarray, grid: Grid, B: tuple[int, ...], N: int,
                max_states: int, *, yield_gil: bool = False) -> Chain:
    """Reachable states from all N requests waiting at the entry model (model 0), with T, tau, reward.

    ``yield_gil`` releases the GIL every few states, for a background thread next to decoding
    loops: this loop is pure Python and would otherwise hold it for up to the 5 ms switch interval.
    """
    builder = _Builder(P, C, grid, B, N)
    M, W = builder.M, builder.W
    index: dict[int, int] = {builder.initial(): 0}
    codes: list[int] = list(index)
    states: list[State] = []
    rows: list[int] = []
    cols: list[int] = []
    probs: list[float] = []
    holding: list[int] = []
    reward: list[float] = []
    while len(states) < len(codes):
        position = len(states)
        state = builder.decode(codes[position])
        states.append(state)
        b, r = state[M:2 * M], state[2 * M:]
        tau = min(r[i] for i in range(M) if b[i])
        done = tuple(i for i in range(M) if b[i] and r[i] == tau)
        holding.append(tau)
        reward.append(sum(b[i] * builder.tokens_per_request[i] for i in done))
        offset = W * sum((r[j] - tau) * builder.r_weight[j] for j in range(M) if b[j] and j not in done)
        targets, move_probs = builder.moves(codes[position] % W, done)
        for target in targets:
            column = index.setdefault(target + offset, len(codes))
            if column == len(codes):
                codes.append(target + offset)
            cols.append(column)
        if len(codes) > max_states:
            raise StateSpaceTooLarge(f"more than {max_states} reachable states")
        if yield_gil and position % _YIELD_EVERY == 0:
            time.sleep(0)
        rows.extend([position] * len(targets))
        probs.extend(move_probs)
    n = len(states)
    transition = sparse.csr_matrix((probs, (rows, cols)), shape=(n, n))  # duplicates are summed
    return Chain(states, transition, np.asarray(holding, dtype=float), np.asarray(reward))
