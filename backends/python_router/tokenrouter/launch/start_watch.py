"""Notices a tritonserver start that has stopped moving: its processes (tritonserver and the Python
stubs, its process group: it runs in a session of its own) used next to no CPU for ``stall_s`` while the
server was not ready.

A loading start always burns CPU (interpreters, imports, weights). One kind of hang seen on two busy
cores does not (docs/reliability.md, "A start that hangs"): a stub starved of CPU misses the Python
backend's health check while it initializes, and Triton's model-load thread then waits forever on the
idle stub. Such a start never gets ready by itself; ``TritonServer.start_ready`` stops it and starts again.
"""

from __future__ import annotations

import time
from typing import Callable

from tokenrouter.procfs import group_cpu_s

# An idle group uses well under this share of one core (a stub's health flag, Triton's timers); a loading
# one uses most of a core even when starved by other work.
IDLE_SHARE = 0.02


class StallWatch:
    """``stalled()`` says why the start looks stopped, or None while it moves (read it every fraction of a
    second while waiting for readiness)."""

    def __init__(self, pgid: int, stall_s: float, clock: Callable[[], float] = time.monotonic,
                 cpu_s: Callable[[int], float] = group_cpu_s) -> None:
        self._pgid, self._stall_s, self._clock, self._cpu_s = pgid, stall_s, clock, cpu_s
        self._since, self._cpu_at_since = clock(), cpu_s(pgid)

    def stalled(self) -> str | None:
        now, cpu = self._clock(), self._cpu_s(self._pgid)
        used = cpu - self._cpu_at_since  # negative when a stub exited and took its CPU time along
        if used < 0 or used > IDLE_SHARE * self._stall_s:
            self._since, self._cpu_at_since = now, cpu
            return None
        if now - self._since < self._stall_s:
            return None
        return (f"tritonserver's start stalled: its processes used {used:.2f} s of CPU in the last "
                f"{now - self._since:.0f} s and it is not ready")
