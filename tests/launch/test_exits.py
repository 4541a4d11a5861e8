"""The supervisor learns of a process's death the moment it happens (a pidfd each), not at its next scan."""

from __future__ import annotations

import subprocess
import time

from tokenrouter.launch.exits import ProcessExits


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "60"])


def test_a_death_is_reported_at_once_and_only_that_one() -> None:
    first, second = _sleeper(), _sleeper()
    try:
        with ProcessExits({"first": first.pid, "second": second.pid}) as exits:
            assert exits.wait(0.05) == []
            first.kill()
            killed = time.monotonic()
            assert exits.wait(5.0) == ["first"]
            assert time.monotonic() - killed < 0.1
            assert exits.wait(0.05) == []  # reported once; the other one still runs
    finally:
        for process in (first, second):
            process.kill()
            process.wait()


def test_a_process_gone_before_it_is_watched_is_reported_first() -> None:
    gone = _sleeper()
    gone.kill()
    gone.wait()  # reaped: its pid no longer exists
    with ProcessExits({"gone": gone.pid}) as exits:
        assert exits.wait(5.0) == ["gone"]


def test_an_unreaped_child_counts_as_dead() -> None:
    """A stub that died but that tritonserver has not reaped yet (a zombie) is dead."""
    zombie = _sleeper()
    try:
        with ProcessExits({"zombie": zombie.pid}) as exits:
            zombie.kill()
            time.sleep(0.2)  # not waited for: it stays a zombie
            assert exits.wait(0.0) == ["zombie"]
    finally:
        zombie.wait()
