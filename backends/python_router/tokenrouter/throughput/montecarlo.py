"""A discrete-event simulation of delayed batching, independent of the Markov chain.

It follows requests one by one (each completed row draws its own destination) on an integer
nanosecond clock, with no grid, no state encoding and no linear algebra, so agreement with
``predict`` checks the chain's construction and its stationary solve. It also models what the chain
cannot: a per-handoff latency, during which a row is on its way between two servers, and pools of
several instances per model with requests pinned to one instance of each (``pools.py``), and with
``prefill`` each request's tokens: its prompt, what each model has been fed, the prefill or extend
every arriving row feeds, and the request's end after ``output_tokens`` (``prefill.py``).
"""

from __future__ import annotations

import heapq
from typing import Sequence

import numpy as np

from .inputs import (Latency, check_matrices, check_pool_thresholds, check_population, check_workers, latency_table,
                     placement)
from .prefill import PrefillCosts, check_costs, feed_cost


def simulate(P: Sequence[Sequence[float]] | np.ndarray, C: Sequence[Sequence[float]] | np.ndarray,
             L: Sequence[Latency], B: Sequence[int], N: int, *, events: int = 100_000,
             warmup: int = 1_000, seed: int = 0, handoff_s: float = 0.0,
             workers: Sequence[int] | None = None, prefill: PrefillCosts | None = None) -> float:
    """Committed tokens per second over ``events`` batch completions after ``warmup`` ones.

    ``handoff_s``: a row that moves to another model reaches it that much later (a network between
    two servers); it is in neither model's queue meanwhile, and both models go on.
    ``workers``: instances per model (default one each); each request is pinned to one instance of
    every model (``inputs.placement``) and B_i applies to every instance of model i.
    ``prefill``: every row also costs what it feeds (``prefill.feed_cost``); a request that has
    committed ``output_tokens`` ends and a new one (a fresh prompt) starts at its entry instance."""
    p, c = check_matrices(P, C)
    N = check_population(N)
    M = len(p)
    counts = check_workers(workers if workers is not None else [1] * M, M, N)
    B = check_pool_thresholds(B, counts, N)
    if handoff_s < 0:
        raise ValueError(f"handoff_s must be >= 0, got {handoff_s}")
    nanos = np.rint(latency_table(L, M, N) * 1e9).astype(np.int64)
    transit_ns = int(round(handoff_s * 1e9))
    if prefill is not None:
        check_costs(prefill, p, c)
    tracker = _Tokens(prefill, N, M, seed) if prefill is not None else None
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])  # instance ids: model j's are first[j] + x
    model_of = np.repeat(np.arange(M), counts).tolist()
    pinned = (placement(N, counts) + first).tolist()  # pinned[r][j]: request r's instance of model j
    rng = np.random.default_rng(seed)
    cumulative = np.cumsum(p, axis=1)
    waiting: list[list[int]] = [[] for _ in model_of]
    for request in range(N):  # all requests start at the entry model
        waiting[pinned[request][0]].append(request)
    running: list[list[int]] = [[] for _ in model_of]
    finish: list[int | None] = [None] * len(model_of)
    in_transit: list[tuple[int, int, int]] = []  # heap of (arrival time, instance, request)
    now = measured_from = 0
    tokens = 0.0
    completions = 0
    while completions < warmup + events:
        for u, i in enumerate(model_of):  # idle instances whose queue reached the threshold start everything
            if finish[u] is None and len(waiting[u]) >= B[i]:
                running[u], waiting[u] = waiting[u], []
                step_ns = int(nanos[i, len(running[u]) - 1])
                if tracker is not None:
                    step_ns += int(round(1e9 * sum(tracker.feed(request, i) for request in running[u])))
                finish[u] = now + step_ns
        next_finish = min((t for t in finish if t is not None), default=None)
        if in_transit and (next_finish is None or in_transit[0][0] < next_finish):
            now, instance, request = heapq.heappop(in_transit)  # a handed-off row arrives
            waiting[instance].append(request)
            continue
        if completions == warmup:
            tokens, measured_from = 0.0, now
        if next_finish is None:  # check_pool_thresholds refuses the thresholds that can get here
            raise RuntimeError(f"no instance runs and no row is in transit: B = {list(B)} deadlocked")
        completions += 1
        now = next_finish
        for u, i in enumerate(model_of):
            if finish[u] != now:
                continue
            rows = running[u]
            destinations = np.minimum(np.searchsorted(cumulative[i], rng.random(len(rows)), side="right"), M - 1)
            for request, j in zip(rows, destinations.tolist()):
                tokens += c[i, j]
                if tracker is not None and tracker.commit(request, int(round(c[i, j]))):
                    j = 0  # the request ended: its successor starts at the entry
                if j == i or transit_ns == 0:
                    waiting[pinned[request][j]].append(request)
                else:
                    heapq.heappush(in_transit, (now + transit_ns, pinned[request][j], request))
            running[u], finish[u] = [], None
    return tokens / ((now - measured_from) * 1e-9)


class _Tokens:
    """Each request's tokens for the prefill charges: prompt, committed count, what each model was fed."""

    def __init__(self, prefill: PrefillCosts, N: int, M: int, seed: int) -> None:
        self.prefill = prefill
        self.rng = np.random.default_rng([seed, 1])  # its own stream: the routing draws stay as they were
        self.prompt = [0] * N
        self.committed = [0] * N
        self.fed = [[0] * M for _ in range(N)]
        self.last: list[int | None] = [None] * N  # the model of the request's previous row
        for request in range(N):
            self._start(request)

    def _start(self, request: int) -> None:
        lo, hi = self.prefill.prompt_tokens
        self.prompt[request] = int(self.rng.integers(lo, hi + 1))
        self.committed[request] = 0
        self.fed[request] = [0] * len(self.fed[request])
        self.last[request] = None

    def feed(self, request: int, model: int) -> float:
        """The row of ``request`` starting on ``model``: feed its context, return the seconds that costs."""
        context = self.prompt[request] + self.committed[request]
        cost = feed_cost(self.prefill, model, context - self.fed[request][model], self.last[request] != model)
        self.fed[request][model], self.last[request] = context, model
        return cost

    def commit(self, request: int, tokens: int) -> bool:
        """Commit a row's tokens; True when that ended the request (a new one took its place)."""
        self.committed[request] += tokens
        if self.committed[request] < self.prefill.output_tokens:
            return False
        self._start(request)
        return True
