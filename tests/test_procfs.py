"""proc_stat reads /proc/<pid>/stat right: checked against what the kernel says by other ways
(os.getppid, os.getpgrp, time.process_time, /proc/uptime), for a child whose command name holds
spaces and parentheses, through its zombie state to its end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tokenrouter.procfs import child_pids, group_cpu_s, proc_stat

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="Linux /proc only")

TRICKY_NAME = "a) b (c"  # a command name that splitting at the first ")" would misread
CHILD = f"""
import ctypes, sys, time
ctypes.CDLL(None).prctl(15, {TRICKY_NAME.encode()!r}, 0, 0, 0)  # PR_SET_NAME
print("ready", flush=True)
time.sleep(60)
"""


def _uptime_s() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def test_own_process_matches_what_os_reports():
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # CPU time worth comparing
        pass
    stat = proc_stat(os.getpid())
    assert stat is not None
    assert (stat.state, stat.ppid, stat.pgrp) == ("R", os.getppid(), os.getpgrp())
    assert stat.cpu_s == pytest.approx(time.process_time(), abs=0.05)
    assert stat.start_ticks / os.sysconf("SC_CLK_TCK") <= _uptime_s()


def test_a_child_with_parentheses_in_its_name_through_its_end():
    spawned_at = _uptime_s()
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        stat = proc_stat(child.pid)
        assert stat is not None
        assert (stat.comm, stat.ppid, stat.pgrp) == (TRICKY_NAME, os.getpid(), os.getpgrp())
        assert stat.state in ("S", "R")
        assert stat.start_ticks / os.sysconf("SC_CLK_TCK") == pytest.approx(spawned_at, abs=1.0)
        assert stat.start_ticks >= proc_stat(os.getpid()).start_ticks
        child.kill()
        deadline = time.monotonic() + 10
        while proc_stat(child.pid).state != "Z" and time.monotonic() < deadline:  # dead, not yet reaped
            time.sleep(0.01)
        assert proc_stat(child.pid).state == "Z"
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    assert proc_stat(child.pid) is None
    assert proc_stat("self-not-a-pid") is None


def test_child_pids_sees_children_of_any_thread():
    import threading

    started: list[subprocess.Popen] = []
    thread = threading.Thread(target=lambda: started.append(subprocess.Popen([sys.executable, "-c", "input()"],
                                                                              stdin=subprocess.PIPE)))
    thread.start()
    thread.join()
    child = started[0]
    try:
        assert child.pid in child_pids(os.getpid())  # started by another thread of this process
    finally:
        child.kill()
        child.wait()
    assert child.pid not in child_pids(os.getpid()) and child_pids(2**22 + 1) == []


BURNER = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\ntime.sleep(60)"
LEADER = f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {BURNER!r}])\ntime.sleep(60)"


def test_group_cpu_counts_every_member_of_the_group() -> None:
    """Catches a count of the group's leader alone: the leader sleeps while a process it started (in its
    group, as a stub is in tritonserver's) burns half a second; nothing is counted once the group is gone."""
    leader = subprocess.Popen([sys.executable, "-c", LEADER], start_new_session=True)  # a group of its own
    try:
        def others_cpu_s() -> float:  # what the group's members but the leader used
            own = proc_stat(leader.pid)
            return group_cpu_s(leader.pid) - (own.cpu_s if own is not None else 0.0)

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and others_cpu_s() < 0.5:
            time.sleep(0.05)
        assert others_cpu_s() >= 0.5
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
    deadline = time.monotonic() + 5  # the burner, reparented, is reaped by init
    while group_cpu_s(leader.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert group_cpu_s(leader.pid) == 0.0
