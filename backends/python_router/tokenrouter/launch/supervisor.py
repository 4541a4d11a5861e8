"""Keep one tritonserver serving: restart it when it dies or when one of its Python stubs dies;
and the OpenAI-compatible server beside it, alone, when that one dies.

Triton 2.51 does not bring a killed Python stub back, keeps reporting the model (and the server)
ready, and cannot reload it either: a `load` of the model is a no-op and an `unload` never
finishes (seen here; docs/reliability.md). So the launcher watches the stub processes itself
and, the moment one dies (a pidfd per process, launch/exits.py), ends the requests in flight with a
clear error (through the entry model, when that one is still alive), makes the server answer not
ready (its shutdown begins) and restarts the whole server on the same ports.

An operator's reload (a config edit to apply: SIGHUP to the launcher, serve.py) is a restart too,
drained first: the fronts refuse new requests and those in flight finish (server_control.py, drain).

It never gives up on a repository that served once: restarts that come too often (a crash loop)
and restarts that fail are spaced by a growing delay, each one said in the log, and tried again.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from typing import Callable, NoReturn

from .exits import ProcessExits
from .openai_process import OpenAIServer
from .errors import TritonError
from .triton_server import TritonServer

# what _watch names when that process died, or when an operator asked for a reload (no model has such a name)
OPENAI_SERVER, TRITONSERVER, RELOAD = "<the OpenAI server>", "<tritonserver>", "<a reload>"
# How often the watch looks at the reload flag: a SIGHUP handler only sets it (signals do not end a poll).
RELOAD_CHECK_S = 0.25
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
                 say: Callable[[str], None], openai: OpenAIServer | None = None, drain_timeout_s: float = 30.0) -> None:
        """``server``: started and ready; the models that have a Python stub now must have one
        after every restart. ``entry``: the entry subserver, ``fronts`` the front models (None and []:
        not a TokenRouter repository, nothing to end by hand). ``openai``: the OpenAI server, started
        and ready (None: none). ``drain_timeout_s``: what a reload gives the requests in flight."""
        self.server, self._entry, self._fronts = server, entry, fronts
        self._ready_timeout_s, self._say, self._drain_timeout_s = ready_timeout_s, say, drain_timeout_s
        self.openai = openai
        self._models = frozenset(server.ready_stubs)
        self._restarts: deque[float] = deque()
        self._reload = threading.Event()

    def request_reload(self) -> None:
        """Drain and restart the server, which reads its repository again (safe in a signal handler)."""
        self._reload.set()

    def run_forever(self) -> NoReturn:
        """Watch and restart until interrupted (by the caller's signal handler)."""
        while True:
            cause, dead = self._watch()
            if dead == [OPENAI_SERVER]:
                self._restart_openai(cause)
            elif dead == [RELOAD]:
                self._reload_server()
            else:
                self._restart(cause, dead)

    def _watch(self) -> tuple[str, list[str]]:
        """Block until something is wrong; returns what, and which models lost their stub. A death is
        seen the moment it happens (a pidfd per process), not at the next look."""
        stubs = dict(self.server.ready_stubs)  # this server's: a restart made new processes
        missing = sorted(self._models - set(stubs))
        if missing:
            return f"model {', '.join(missing)} has no Python stub (not loaded)", missing
        watched = {**stubs, TRITONSERVER: self.server.running.pid}
        if self.openai is not None:
            watched[OPENAI_SERVER] = self.openai.running.pid
        with ProcessExits(watched) as exits:
            while True:
                exited = exits.wait(RELOAD_CHECK_S)
                if TRITONSERVER in exited:
                    return f"tritonserver exited with code {self.server.running.wait()}", list(stubs)
                if OPENAI_SERVER in exited and self.openai is not None:
                    return f"the OpenAI server exited with code {self.openai.running.wait()}", [OPENAI_SERVER]
                if exited:
                    return f"the Python stub of model {', '.join(sorted(exited))} died", sorted(exited)
                if self._reload.is_set():
                    return "a reload was asked for", [RELOAD]

    def _reload_server(self) -> None:
        """Drain (new requests refused with a reason that says to retry, those in flight finish, the
        rest end with that reason at the deadline), then start the server again: it reads the
        repository's configs as they are now."""
        self._reload.clear()
        reason = "the server is restarting to apply a configuration change; try again in a moment"
        self._say(f"reload: refusing new requests, draining those in flight (up to {self._drain_timeout_s:g} s)")
        if not self.server.control.drain(self._fronts, self._drain_timeout_s, self._entry, reason):
            self._say("reload: the drain timed out; ending the requests still in flight")
            if self._end_in_flight(reason, []):
                time.sleep(ERRORS_GRACE_S)
        self.server.stop()
        self._start_again(0.0)

    def _restart(self, cause: str, dead: list[str]) -> None:
        delay = self._next_delay_s()
        when = f" in {delay:g} s ({len(self._restarts)} restarts within {RESTART_WINDOW_S:g} s)" if delay else ""
        self._say(f"{cause}; ending the requests in flight and restarting tritonserver{when}")
        ended = self._end_in_flight(f"{cause}; the server is restarting, try again", dead)
        self.server.turn_not_ready()  # at once, not after the grace: clients and balancers probe readiness
        if ended:
            time.sleep(ERRORS_GRACE_S)
        # Killed at once: the requests the entry could not end (it died, or the server did) see the
        # connection close now rather than after a graceful shutdown, and the restart starts sooner.
        self.server.stop(grace_s=0.0)
        self._start_again(delay)

    def _start_again(self, delay: float) -> None:
        """A new server process with the same settings and ports, tried until one is ready."""
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
        assert self.openai is not None, "only a watched OpenAI server dies"
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
        ended = [self.server.control.end_in_flight(front, reason)
                 for front in self._fronts if front not in dead]
        if self._entry is not None and self._entry not in dead:
            ended.append(self.server.control.end_in_flight(self._entry, reason))
        return any(ended)

    def _next_delay_s(self) -> float:
        """Counts a restart; how long to wait before it."""
        now = time.monotonic()
        self._restarts.append(now)
        while self._restarts[0] < now - RESTART_WINDOW_S:
            self._restarts.popleft()
        return backoff_s(len(self._restarts))


def backoff_s(restarts_in_window: int) -> float:
    """The wait before a restart, given how many restarts (this one included) fell within
    RESTART_WINDOW_S: none for the first FREE_RESTARTS, then doubling up to BACKOFF_MAX_S, never
    a refusal (the launcher never gives up)."""
    over = restarts_in_window - FREE_RESTARTS
    return 0.0 if over <= 0 else min(BACKOFF_FIRST_S * 2.0 ** min(over - 1, 32), BACKOFF_MAX_S)  # no overflow
