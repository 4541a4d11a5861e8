"""`tokenrouter serve`'s supervisor across many restarts: after each one it watches the new server's
stubs (a supervisor that kept the dead pids restarted again at once, 5 times, and then gave up and
exited), the server serves real requests, and it never gives up; an operator's reload (SIGHUP) is
one drained restart, not a fault.

The repository is the echo one cut to the decoupled front and the echo subserver double: it
restarts in seconds, and what is tested is the launcher, not the engines.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from helpers.servers import render_lean_echo_repository
from helpers.supervised import Launcher
from tokenrouter.launch.supervisor import BACKOFF_MAX_S, FREE_RESTARTS
from tokenrouter.launch.processes import process_alive
from tokenrouter.launch.shared_memory import shm_regions_of

RESTARTS = FREE_RESTARTS + 1  # past the 5 after which the launcher used to exit ("giving up")
RESTART_S = 120.0  # an echo server starts in seconds; a loaded 2-core machine takes longer
RESTARTING, READY_AGAIN, RELOADING = "restarting tritonserver", "ready again", "reload: refusing new requests"


@pytest.fixture(scope="module")
def launcher(tiny_pair: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    repository = render_lean_echo_repository(tmp_path_factory.mktemp("supervised") / "repo", tiny_pair["small"])
    served = Launcher(repository)
    yield served
    served.process.send_signal(signal.SIGTERM)
    try:
        served.process.wait(timeout=60)
    except Exception:
        served.process.kill()
        served.process.wait()


def test_an_operators_reload_is_one_drained_restart_and_the_new_stubs_are_watched(launcher: Launcher) -> None:
    restarts, reloads, ready = launcher.count(RESTARTING), launcher.count(RELOADING), launcher.count(READY_AGAIN)
    old = launcher.stubs()
    launcher.process.send_signal(signal.SIGHUP)
    launcher.wait_for(READY_AGAIN, ready + 1, RESTART_S)
    new = launcher.stubs()
    assert sorted(new) == sorted(old) and not set(new.values()) & set(old.values())
    assert (launcher.count(RELOADING), launcher.count(RESTARTING)) == (reloads + 1, restarts)  # not a fault
    launcher.serves()
    os.kill(new["echo"], signal.SIGKILL)  # the supervisor watches the new stubs: a death is a fault
    launcher.wait_for(READY_AGAIN, ready + 2, RESTART_S)
    assert launcher.count(RESTARTING) == restarts + 1
    launcher.serves()


def test_every_restart_watches_the_new_stubs_and_serves(launcher: Launcher) -> None:
    launcher.serves()
    models = sorted(launcher.stubs())
    restarts, reloads, ready = launcher.count(RESTARTING), launcher.count(RELOADING), launcher.count(READY_AGAIN)
    for i in range(RESTARTS):
        before = launcher.stubs()
        os.kill(before[models[i % len(models)]], signal.SIGKILL)
        launcher.wait_for(READY_AGAIN, ready + i + 1, RESTART_S)  # a reload says "ready again" too
        after = launcher.stubs()
        assert sorted(after) == models and not set(after.values()) & set(before.values())
        launcher.serves()
        # One restart per kill: a supervisor that watched the dead stubs would restart again at once
        time.sleep(1.0)
        assert launcher.count(RESTARTING) == restarts + i + 1, "".join(launcher.lines[-20:])
        assert all(process_alive(pid) for pid in after.values())
    assert launcher.count(RELOADING) == reloads, "a kill was taken for a reload"
    assert any("restarts within" in line for line in launcher.lines), "no backoff past the free restarts"


def test_a_killed_tritonserver_leaves_no_shared_memory(launcher: Launcher) -> None:
    """Triton removes its shared-memory regions on a clean exit only; after a SIGKILL the supervisor
    must (117 regions, 123 MB, had piled up on this machine)."""
    ready = launcher.count(READY_AGAIN)
    server = launcher.server_pid()
    regions = shm_regions_of([server, *launcher.stubs().values()])
    assert regions, "the server's stubs should have shared-memory regions"
    os.kill(server, signal.SIGKILL)
    launcher.wait_for(READY_AGAIN, ready + 1, RESTART_S)
    launcher.serves()
    assert not {region for region in regions if region.exists()}, "regions of the killed server left behind"


FORCED_RESTARTS = 20


@pytest.mark.slow
def test_twenty_forced_restarts_within_ten_minutes_and_it_serves_after_each(launcher: Launcher) -> None:
    """Last in the module (past 5 restarts in 10 minutes each one waits up to 15 s). A stub killed
    every time the server is back: the supervisor never gives up, each restart is one, and the server
    serves after every one."""
    models = sorted(launcher.stubs())
    restarts, started = launcher.count(RESTARTING), time.monotonic()
    for i in range(FORCED_RESTARTS):
        os.kill(launcher.stubs()[models[i % len(models)]], signal.SIGKILL)
        launcher.wait_for(READY_AGAIN, launcher.count(READY_AGAIN) + 1, timeout_s=RESTART_S + 15)
        launcher.serves()
        assert launcher.count(RESTARTING) == restarts + i + 1, "".join(launcher.lines[-20:])
    took = time.monotonic() - started
    print(f"{FORCED_RESTARTS} forced restarts, served after each, in {took:.0f} s")
    # the backoff reached its cap, and the launcher went on (it used to give up after 5 in 10 minutes)
    assert any(f"in {BACKOFF_MAX_S:g} s (" in line for line in launcher.lines), "".join(launcher.lines[-20:])
    assert launcher.process.poll() is None
