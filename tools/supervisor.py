"""Keep one tritonserver serving: restart it when it dies or when one of its Python stubs dies.

Triton 2.51 does not bring a killed Python stub back, keeps reporting the model (and the server)
ready, and cannot reload it either: a `load` of the model is a no-op and an `unload` never
finishes (seen here; docs/reliability.md). So the launcher watches the stub processes itself
and, when one dies, ends the requests in flight with a clear error (through the entry model,
when that one is still alive) and restarts the whole server on the same ports.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from typing import Callable

from .triton_server import TritonError, TritonServer, process_alive

WATCH_PERIOD_S = 0.25
ERRORS_GRACE_S = 0.5  # for the errors of the requests in flight to reach their clients
MAX_RESTARTS, RESTART_WINDOW_S = 5, 600.0  # more than that: something is wrong for good, give up


class Supervisor:
    def __init__(self, server: TritonServer, entry: str | None, ready_timeout_s: float,
                 say: Callable[[str], None]) -> None:
        """``server``: started and ready. ``entry``: the entry subserver (None: not a TokenRouter
        repository, nothing to end by hand)."""
        self.server, self._entry, self._ready_timeout_s, self._say = server, entry, ready_timeout_s, say
        self._restarts: deque[float] = deque()

    def run_forever(self) -> None:
        """Watch and restart until interrupted (by the caller's signal handler) or until restarts
        fail: raises TritonError then."""
        while True:
            self._restart(*self._watch())

    def _watch(self) -> tuple[str, list[str]]:
        """Block until something is wrong; returns what, and which models lost their stub."""
        stubs = self.server.ready_stubs
        while True:
            time.sleep(WATCH_PERIOD_S)
            code = self.server.process.poll()
            if code is not None:
                return f"tritonserver exited with code {code}", list(stubs)
            dead = sorted(model for model, pid in stubs.items() if not process_alive(pid))
            if dead:
                return f"the Python stub of model {', '.join(dead)} died", dead

    def _restart(self, cause: str, dead: list[str]) -> None:
        now = time.monotonic()
        self._restarts.append(now)
        while self._restarts[0] < now - RESTART_WINDOW_S:
            self._restarts.popleft()
        if len(self._restarts) > MAX_RESTARTS:
            raise TritonError(f"{cause}; {MAX_RESTARTS} restarts within {RESTART_WINDOW_S:g} s already: giving up")
        self._say(f"{cause}; ending the requests in flight and restarting tritonserver")
        if self._entry is not None and self._entry not in dead:
            if self.server.end_in_flight(self._entry, f"{cause}; the server is restarting, try again"):
                time.sleep(ERRORS_GRACE_S)
        # Killed at once: the requests the entry could not end (it died, or the server did) see the
        # connection close now rather than after a graceful shutdown, and the restart starts sooner.
        self.server.stop(grace_s=0.0)
        self.server = dataclasses.replace(self.server)  # same settings and ports, a new process
        self.server = self.server.start_ready(self._ready_timeout_s, say=self._say)
        self._say("ready again")
