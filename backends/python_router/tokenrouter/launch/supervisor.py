"""Keep one tritonserver serving: restart it when it dies or when one of its Python stubs dies;
and the OpenAI-compatible server beside it, alone, when that one dies.

Triton 2.51 does not bring a killed Python stub back, keeps reporting the model (and the server)
ready, and cannot reload it either: a `load` of the model is a no-op and an `unload` never
finishes (seen here; docs/reliability.md). So the launcher watches the stub processes itself
and, the moment one dies, makes the server answer not ready (an unload that never finishes does
that), ends the requests in flight with a clear error (through the entry model, when that one is
still alive) and restarts the whole server on the same ports.

It never gives up on a repository that served once: restarts that come too often (a crash loop)
and restarts that fail are spaced by a growing delay, each one said in the log, and tried again.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from typing import Callable

from .exits import ProcessExits
from .openai_process import OpenAIServer
from .triton_server import TritonError, TritonServer

# what _watch names when that process died (no model has such a name)
OPENAI_SERVER, TRITONSERVER = "<the OpenAI server>", "<tritonserver>"
# Every STATES_PERIOD_S the models' states are read too: a model that is neither READY nor LOADING (an
# operator's reload, which may take minutes) for NOT_READY_S is a fault. An unload that cannot finish
# leaves its model UNLOADING, its stub alive and the server not ready for as long as a client keeps a
# gRPC stream open to it (Triton 2.51 holds the model for each such stream; triton_server.py, drain),
# which nothing else would notice.
STATES_PERIOD_S, NOT_READY_S = 2.0, 10.0
# For the errors of the requests in flight to reach their clients before the server is killed: the
# fronts have sent them when their control call returns, Triton's gRPC frontend writes them later.
# 0.5 s lost one stream's error ("Socket closed" instead) in 1 of 10 fault-test runs at load 3.
ERRORS_GRACE_S = 2.0
# Up to FREE_RESTARTS restarts within RESTART_WINDOW_S go at once; each one past that waits twice as
# long as the one before, from BACKOFF_FIRST_S up to BACKOFF_MAX_S: a crash loop does not spin the
# CPU, and a server killed now and then is back as fast as it starts.
FREE_RESTARTS, RESTART_WINDOW_S = 5, 600.0
BACKOFF_FIRST_S, BACKOFF_MAX_S = 1.0, 15.0


class Supervisor:
    def __init__(self, server: TritonServer, entry: str | None, fronts: list[str], ready_timeout_s: float,
                 say: Callable[[str], None], openai: OpenAIServer | None = None) -> None:
        """``server``: started and ready; the models that have a Python stub now must have one
        after every restart. ``entry``: the entry subserver, ``fronts`` the front models (None and []:
        not a TokenRouter repository, nothing to end by hand). ``openai``: the OpenAI server, started
        and ready (None: none)."""
        self.server, self._entry, self._fronts = server, entry, fronts
        self._ready_timeout_s, self._say = ready_timeout_s, say
        self.openai = openai
        self._models = frozenset(server.ready_stubs)
        self._restarts: deque[float] = deque()

    def run_forever(self) -> None:
        """Watch and restart until interrupted (by the caller's signal handler)."""
        while True:
            cause, dead = self._watch()
            if dead == [OPENAI_SERVER]:
                self._restart_openai(cause)
            else:
                self._restart(cause, dead)

    def _watch(self) -> tuple[str, list[str]]:
        """Block until something is wrong; returns what, and which models lost their stub. A death is
        seen the moment it happens (a pidfd per process), and the server stops reporting ready at once."""
        stubs = dict(self.server.ready_stubs)  # this server's: a restart made new processes
        missing = sorted(self._models - set(stubs))
        if missing:  # e.g. an unload that landed while the server was starting
            return f"model {', '.join(missing)} has no Python stub (not loaded)", missing
        not_ready: dict[str, float] = {}  # model -> since when it is seen not READY
        states_read = time.monotonic()
        watched = {**stubs, TRITONSERVER: self.server.process.pid}
        if self.openai is not None:
            watched[OPENAI_SERVER] = self.openai.process.pid
        with ProcessExits(watched) as exits:
            while True:
                exited = exits.wait(states_read + STATES_PERIOD_S - time.monotonic())
                if TRITONSERVER in exited:
                    return f"tritonserver exited with code {self.server.process.wait()}", list(stubs)
                if OPENAI_SERVER in exited:
                    return f"the OpenAI server exited with code {self.openai.process.wait()}", [OPENAI_SERVER]
                if not exited:
                    states_read = time.monotonic()
                    stuck = self._not_ready_for_long(not_ready)
                    if stuck:
                        return f"model {', '.join(stuck)} is not ready (an unload that cannot finish?)", stuck
                    continue
                dead = sorted(exited)
                # An operator's reload (the repository API, with the admin key) starts the new stub
                # before it ends the old one: that model serves, watch its new process.
                now = self.server.stubs()
                if all(now.get(model, stubs[model]) != stubs[model] for model in dead):
                    for model in dead:
                        stubs[model] = now[model]
                        exits.add(model, now[model])
                    self._say(f"model {', '.join(dead)} was reloaded: watching its new stub")
                    continue
                self.server.report_not_ready(dead)
                return f"the Python stub of model {', '.join(dead)} died", dead

    def _not_ready_for_long(self, not_ready: dict[str, float]) -> list[str]:
        """The watched models that the index has shown neither READY nor LOADING for NOT_READY_S (``not_ready``:
        since when each was seen so, kept by the caller); an index that cannot be read says nothing."""
        states = self.server.model_states()
        if not states:
            return []
        now = time.monotonic()
        for model in self._models:
            if states.get(model) in ("READY", "LOADING"):
                not_ready.pop(model, None)
            else:
                not_ready.setdefault(model, now)
        return sorted(model for model, since in not_ready.items() if now - since >= NOT_READY_S)

    def _restart(self, cause: str, dead: list[str]) -> None:
        delay = self._next_delay_s()
        when = f" in {delay:g} s ({len(self._restarts)} restarts within {RESTART_WINDOW_S:g} s)" if delay else ""
        self._say(f"{cause}; ending the requests in flight and restarting tritonserver{when}")
        if self._end_in_flight(f"{cause}; the server is restarting, try again", dead):
            time.sleep(ERRORS_GRACE_S)
        # Killed at once: the requests the entry could not end (it died, or the server did) see the
        # connection close now rather than after a graceful shutdown, and the restart starts sooner.
        self.server.stop(grace_s=0.0)
        while True:
            time.sleep(delay)
            self.server = dataclasses.replace(self.server)  # same settings and ports, a new process
            try:
                self.server = self.server.start_ready(self._ready_timeout_s, say=self._say)
            except TritonError as failed:  # the failed start left nothing behind
                delay = self._next_delay_s()
                self._say(f"the restart failed ({str(failed).splitlines()[0]}); trying again in {delay:g} s")
                continue
            self._say(f"ready again in {self.server.start_times.summary()}")
            return

    def _restart_openai(self, cause: str) -> None:
        """The OpenAI server alone: its clients' connections died with it, Triton's requests go on."""
        while True:
            delay = self._next_delay_s()
            self._say(f"{cause}; restarting it" + (f" in {delay:g} s" if delay else ""))
            time.sleep(delay)
            self.openai = dataclasses.replace(self.openai)  # same settings and port, a new process
            try:
                self.openai.start().wait_ready(self._ready_timeout_s)
            except TritonError as failed:
                cause = f"the OpenAI server's restart failed ({str(failed).splitlines()[0]})"
                continue
            self._say("the OpenAI server is ready again")
            return

    def _end_in_flight(self, reason: str, dead: list[str]) -> bool:
        """Every live model that holds client requests ends them with ``reason``: the fronts (their
        clients learn it even when the entry is the model that died) and the entry (its own clients,
        and it frees their KV). Whether any did."""
        ended = [self.server.end_in_flight(front, reason, subserver=False)
                 for front in self._fronts if front not in dead]
        if self._entry is not None and self._entry not in dead:
            ended.append(self.server.end_in_flight(self._entry, reason))
        return any(ended)

    def _next_delay_s(self) -> float:
        """Counts a restart; how long to wait before it."""
        now = time.monotonic()
        self._restarts.append(now)
        while self._restarts[0] < now - RESTART_WINDOW_S:
            self._restarts.popleft()
        over = len(self._restarts) - FREE_RESTARTS
        return 0.0 if over <= 0 else min(BACKOFF_FIRST_S * 2 ** (over - 1), BACKOFF_MAX_S)
