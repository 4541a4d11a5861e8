"""``batch_threshold: auto``: estimate L_i and p_ij, c_ij online and keep B* up to date.

Decoding loops report every step (``observe_step``, ``observe_routes``) and read thresholds
(``thresholds``); those calls only touch a few counters under a short lock. A daemon thread wakes
every ``poll_s`` seconds, compares the estimates with those of the last solve and, when any moved
by more than ``drift`` (relative), solves the throughput model again for every N up to
``max_active`` (the N asked for most recently first) and publishes each result as it lands.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .model import best_thresholds

log = logging.getLogger(__name__)

AUTO_STEPS = 100  # without a delta, the slowest step spans this many grid units
_EMA = 0.05  # weight of a new latency sample once a batch size has 1 / _EMA samples
_MEMORY = 4096  # routed rows per model before old route counts are halved (tracks slow change)
_SIZE_MIN = 3  # samples at a batch size before its own estimate beats the fit
_FLOOR = 0.05  # probabilities and token counts below this drift in absolute, not relative, terms


@dataclass(frozen=True)
class Estimates:
    """A consistent snapshot of what the model is solved with."""

    P: np.ndarray  # M x M routing probabilities
    C: np.ndarray  # M x M committed tokens per transition
    L: np.ndarray  # M x max_active step latency in seconds per batch size
    ready: bool  # every model has min_samples steps and routed rows


class AutoThresholds:
    """Online B* for delayed batching; thread-safe; ``close()`` stops the solver thread."""

    def __init__(self, models: list[str], max_active: int, delta: float | None = None,
                 min_samples: int = 100, drift: float = 0.1, *, poll_s: float = 0.25) -> None:
        if len(models) < 1:
            raise ValueError("AutoThresholds needs at least one model")
        if max_active < 1:
            raise ValueError(f"max_active must be >= 1, got {max_active}")
        if delta is not None and not (math.isfinite(delta) and delta > 0):
            raise ValueError(f"delta must be a time step > 0 seconds or None, got {delta!r}")
        if min_samples < 1 or not drift > 0:
            raise ValueError(f"need min_samples >= 1 and drift > 0, got {min_samples}, {drift}")
        self.models = list(models)
        self.max_active, self.delta, self.min_samples, self.drift = max_active, delta, min_samples, drift
        M = len(models)
        self._lock = threading.Lock()
        # latency per (model, batch size): [estimate, samples]
        self._latency = [dict[int, list[float]]() for _ in range(M)]
        self._steps = [0] * M
        self._routes = np.zeros((M, M))  # (decayed) rows routed i -> j
        self._tokens = np.zeros((M, M))  # (decayed) tokens committed on i -> j
        self._routed = [0.0] * M  # row sums of _routes, kept alongside to stay O(1)
        self._table: dict[int, tuple[int, ...]] = {}  # N -> B*, replaced whole on publish
        self._wanted = 1  # the N asked for most recently
        self._solved: Estimates | None = None
        self._generation = 0
        self._done = threading.Condition()
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(poll_s,), name="auto-thresholds", daemon=True)
        self._thread.start()

    # --- called from decoding loops: O(1)-ish, short lock ------------------------------------
    def observe_step(self, model: int, batch_size: int, latency_s: float) -> None:
        """One engine step of ``model`` with ``batch_size`` rows took ``latency_s`` seconds."""
        if batch_size < 1 or not (math.isfinite(latency_s) and latency_s > 0):
            raise ValueError(f"need batch_size >= 1 and a latency > 0 s, got {batch_size}, {latency_s!r}")
        with self._lock:
            entry = self._latency[model].setdefault(batch_size, [latency_s, 0])
            entry[1] += 1
            weight = max(1.0 / entry[1], _EMA)  # running mean first, then an EMA
            entry[0] += weight * (latency_s - entry[0])
            self._steps[model] += 1

    def observe_routes(self, model: int, destinations: list[int], committed: list[int]) -> None:
        """One step of ``model``: row r went to ``destinations[r]`` and committed ``committed[r]`` tokens."""
        if len(destinations) != len(committed):
            raise ValueError(f"{len(destinations)} destinations but {len(committed)} committed counts")
        with self._lock:
            routes, tokens = self._routes[model], self._tokens[model]
            for destination, count in zip(destinations, committed):
                routes[destination] += 1
                tokens[destination] += count
            self._routed[model] += len(destinations)
            if self._routed[model] > 2 * _MEMORY:
                routes *= 0.5
                tokens *= 0.5
                self._routed[model] *= 0.5

    # --- one model's observations, between processes (Triton runs one subserver per process) ----
    def export_model(self, model: int) -> dict:
        """What this estimator observed of ``model``, JSON-ready (for the other processes' estimators)."""
        with self._lock:
            return {"latency": {str(b): list(entry) for b, entry in self._latency[model].items()},
                    "steps": self._steps[model], "routes": self._routes[model].tolist(),
                    "tokens": self._tokens[model].tolist(), "routed": self._routed[model]}

    def import_model(self, model: int, observed: dict) -> None:
        """Replace what is known of ``model`` with another process's ``export_model(model)``."""
        M = len(self.models)
        latency = {int(b): [float(e), int(n)] for b, (e, n) in observed["latency"].items()}
        routes, tokens = np.asarray(observed["routes"], float), np.asarray(observed["tokens"], float)
        if routes.shape != (M,) or tokens.shape != (M,) or any(b < 1 for b in latency):
            raise ValueError(f"observations of model {model} do not fit {M} models")
        with self._lock:
            self._latency[model] = latency
            self._steps[model] = int(observed["steps"])
            self._routes[model], self._tokens[model] = routes, tokens
            self._routed[model] = float(observed["routed"])

    def thresholds(self, active: int) -> list[int]:
        """B* for ``active`` requests (all ones until the first solve); sum(B_i - 1) < active."""
        n = min(max(active, 1), self.max_active)
        self._wanted = n
        best = self._table.get(n)
        return list(best) if best is not None else [1] * len(self.models)

    # --- inspection -----------------------------------------------------------------------------
    def estimates(self) -> Estimates:
        with self._lock:
            routes, tokens = self._routes.copy(), self._tokens.copy()
            latency = [{b: tuple(e) for b, e in sizes.items()} for sizes in self._latency]
            ready = all(s >= self.min_samples for s in self._steps) and \
                all(r >= min(self.min_samples, _MEMORY) for r in self._routed)
        M = len(self.models)
        rows = routes.sum(axis=1, keepdims=True)
        P = np.where(rows > 0, routes / np.maximum(rows, 1e-300), np.eye(M))
        C = np.where(routes > 0, tokens / np.maximum(routes, 1e-300), 0.0)
        L = np.array([_latency_curve(sizes, self.max_active) for sizes in latency])
        return Estimates(P, C, L, ready)

    @property
    def generation(self) -> int:
        """Completed solves (each one covers every N up to max_active)."""
        return self._generation

    def wait_for(self, generation: int, timeout: float) -> bool:
        """Block until ``generation`` solves completed; for tests and tools, not decoding loops."""
        with self._done:
            return self._done.wait_for(lambda: self._generation >= generation, timeout)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    # --- the solver thread ----------------------------------------------------------------------
    def _run(self, poll_s: float) -> None:
        while not self._stop.wait(poll_s):
            estimates = self.estimates()
            if not estimates.ready or not self._drifted(estimates):
                continue
            try:
                self._solve(estimates)
            except Exception as err:  # noqa: BLE001  (nothing may kill the thread; keep the old table)
                self.last_error = f"{type(err).__name__}: {err}"
                log.exception("auto thresholds: solve failed, keeping the previous ones")

    def _drifted(self, new: Estimates) -> bool:
        old = self._solved
        if old is None:
            return True
        return max(_relative(new.L, old.L, 0.0), _relative(new.P, old.P, _FLOOR),
                   _relative(new.C, old.C, _FLOOR)) > self.drift

    def _solve(self, estimates: Estimates) -> None:
        delta = self.delta or float(estimates.L.max()) / AUTO_STEPS
        order = [self._wanted] + [n for n in range(1, self.max_active + 1) if n != self._wanted]
        for n in order:
            if self._stop.is_set():
                return
            best, _ = best_thresholds(estimates.P, estimates.C, list(estimates.L[:, :n]), n, delta, snap=True,
                                      yield_gil=True)
            self._table = {**self._table, n: tuple(best)}
        self._solved = estimates
        with self._done:
            self._generation += 1
            self._done.notify_all()


def _latency_curve(sizes: Mapping[int, Sequence[float]], max_active: int) -> np.ndarray:
    """Latency at batch sizes 1..max_active from {size: (estimate, samples)}: a size's own estimate
    once it has a few samples, else a sample-weighted line through all sizes seen (slope >= 0:
    bigger batches never get faster)."""
    if not sizes:
        return np.ones(max_active)  # no data: any constant (the model is not ready anyway)
    xs = np.array(list(sizes), dtype=float)
    ys = np.array([estimate for estimate, _ in sizes.values()])
    weights = np.array([samples for _, samples in sizes.values()], dtype=float)
    mean_x, mean_y = np.average(xs, weights=weights), np.average(ys, weights=weights)
    spread = float(np.sum(weights * (xs - mean_x) ** 2))
    slope = max(0.0, float(np.sum(weights * (xs - mean_x) * (ys - mean_y))) / spread) if spread > 0 else 0.0
    curve = np.maximum(mean_y + slope * (np.arange(1, max_active + 1) - mean_x), ys.min())
    for b, (estimate, samples) in sizes.items():
        if b <= max_active and samples >= _SIZE_MIN:
            curve[b - 1] = estimate
    return curve


def _relative(new: np.ndarray, old: np.ndarray, floor: float) -> float:
    return float(np.max(np.abs(new - old) / np.maximum(np.abs(old), max(floor, 1e-12))))
