"""The fleet launcher's handle on one child process: alive, exit status, terminate, stop."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tokenrouter.fleet.launcher import Process


def _process(tmp_path: Path, code: str) -> Process:
    return Process("child", [sys.executable, "-c", code], tmp_path / "child.log")


def test_a_process_not_started_is_not_alive_and_stopping_it_does_nothing(tmp_path: Path) -> None:
    process = _process(tmp_path, "pass")
    assert not process.alive and process.returncode is None
    process.terminate()
    process.stop(timeout=1.0)
    assert process.popen is None


def test_terminate_sends_sigterm_and_stop_ends_a_running_child_with_it(tmp_path: Path) -> None:
    process = _process(tmp_path, "import time; time.sleep(60)")
    process.start({})
    assert process.alive and process.returncode is None
    process.terminate()
    assert process.popen is not None and process.popen.wait(10) == -15
    process.stop(timeout=10.0)  # ended already: nothing to do
    again = _process(tmp_path, "import time; time.sleep(60)")
    again.start({})
    again.stop(timeout=10.0)
    assert not again.alive and again.returncode == -15


def test_stop_kills_a_child_that_ignores_sigterm(tmp_path: Path) -> None:
    code = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); " \
           "time.sleep(60)"
    process = _process(tmp_path, code)
    process.start({})
    log = tmp_path / "child.log"
    for _ in range(200):  # its handler is set once it printed (bounded: 10 s)
        if log.exists() and b"ready" in log.read_bytes():
            break
        time.sleep(0.05)
    process.stop(timeout=0.3)
    assert not process.alive and process.returncode == -9


def test_an_exited_child_reports_its_status(tmp_path: Path) -> None:
    process = _process(tmp_path, "raise SystemExit(3)")
    process.start({})
    assert process.popen is not None and process.popen.wait(10) == 3
    assert not process.alive and process.returncode == 3
