"""Scheduling strategies: how the subservers' decoding loops relate to each other.

All four run on the same subserver code path; only these hooks differ.

  tokenrouter  asynchronous loops + delayed batching (a model steps once B_i requests are ready)
  eager_async  asynchronous loops, every model steps as soon as anything is runnable (B = 1)
  model_sync   one model computes at a time (a global lock around steps)
  step_sync    rounds: every model with work steps, then all wait at a barrier
"""

from __future__ import annotations

import threading
from typing import Callable, TypeVar

T = TypeVar("T")


class Strategy:
    """Asynchronous execution: no coordination between models."""

    uses_thresholds = False
    lockstep = False
    # Coordinates the models through a lock or a barrier in memory, so they must share one process;
    # the others need nothing from each other but messages (each model may run in its own, as under Triton).
    shares_memory = False

    @classmethod
    def create(cls, num_models: int) -> "Strategy":
        return cls()

    def register(self, has_work: Callable[[], bool]) -> None:
        """Called once per subserver with a probe of whether it could step now."""

    def run_step(self, step: Callable[[], T]) -> T:
        return step()

    def start_round(self) -> None:
        """Lockstep strategies block here until every model reaches the next round."""

    def notify_work(self) -> None:
        """An event arrived for some model."""

    def stop(self) -> None:
        """Release every loop blocked in this strategy."""


class TokenRouterStrategy(Strategy):
    uses_thresholds = True


class ModelSync(Strategy):
    shares_memory = True

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def run_step(self, step: Callable[[], T]) -> T:
        with self._lock:
            return step()


class StepSync(Strategy):
    """A barrier after every step of all models. Messages sent in round r are seen in round r+1,
    because every model finishes round r before any passes the barrier."""

    lockstep = True
    shares_memory = True

    def __init__(self, num_models: int, idle_poll_s: float = 0.05) -> None:
        self._probes: list[Callable[[], bool]] = []
        self._wakeup = threading.Event()
        self._stopping = False
        self._idle_poll_s = idle_poll_s
        self._barrier = threading.Barrier(num_models, action=self._wait_for_work)

    @classmethod
    def create(cls, num_models: int) -> "StepSync":
        return cls(num_models)

    def register(self, has_work: Callable[[], bool]) -> None:
        self._probes.append(has_work)

    def _wait_for_work(self) -> None:
        # Runs in one thread while the others are parked at the barrier: sleep instead of
        # spinning empty rounds when no model has anything to do.
        while not self._stopping and not any(probe() for probe in self._probes):
            self._wakeup.wait(self._idle_poll_s)
            self._wakeup.clear()

    def start_round(self) -> None:
        try:
            self._barrier.wait()
        except threading.BrokenBarrierError:
            if not self._stopping:
                raise

    def notify_work(self) -> None:
        self._wakeup.set()

    def stop(self) -> None:
        self._stopping = True
        self._wakeup.set()
        self._barrier.abort()


# config.StrategyName checks itself against this table: importing the config layer here would make the
# subservers need pydantic, which the device check's bare GPU host does not have (tools/gpu_check.py).
STRATEGY_CLASSES: dict[str, type[Strategy]] = {
    "tokenrouter": TokenRouterStrategy,
    "eager_async": Strategy,
    "model_sync": ModelSync,
    "step_sync": StepSync,
}
# The strategies Triton can serve (one process per model).
MULTI_PROCESS = tuple(name for name, cls in STRATEGY_CLASSES.items() if not cls.shares_memory)


def make_strategy(name: str, num_models: int) -> Strategy:
    cls = STRATEGY_CLASSES.get(name)
    if cls is None:
        raise ValueError(f"unknown strategy '{name}'; allowed: {', '.join(STRATEGY_CLASSES)}")
    return cls.create(num_models)
