"""The stall rule of a start (launch/start_watch.py) on a made-up clock and CPU counter; the
launcher's use of it against a stand-in binary is in test_start_retry.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tokenrouter.launch.start_watch import IDLE_SHARE, StallWatch, tree_cpu_s
from tokenrouter.procfs import ProcStat, proc_stat

BURN = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\ntime.sleep(60)"
ZERO = ProcStat(comm="", state="", ppid=0, pgrp=0, cpu_s=0.0, start_ticks=0)


class Tree:
    """A clock and a process tree's CPU counter that the test moves."""

    def __init__(self) -> None:
        self.now, self.cpu = 0.0, 10.0

    def watch(self, stall_s: float = 60.0) -> StallWatch:
        return StallWatch(1, stall_s, clock=lambda: self.now, cpu_s=lambda pid: self.cpu)

    def run(self, seconds: float, cpu_share: float) -> None:
        self.now += seconds
        self.cpu += seconds * cpu_share


def test_an_idle_tree_is_stalled_after_the_bound_and_not_before() -> None:
    tree = Tree()
    watch = tree.watch()
    tree.run(59.0, IDLE_SHARE / 2)
    assert watch.stalled() is None
    tree.run(1.0, IDLE_SHARE / 2)
    assert "start stalled" in (watch.stalled() or "")


def test_a_slow_but_working_start_is_never_stalled() -> None:
    """Five minutes at a tenth of a core (a start starved by other work) never reads as stalled."""
    tree = Tree()
    watch = tree.watch()
    for _ in range(300):
        tree.run(1.0, 0.1)
        assert watch.stalled() is None


def test_work_restarts_the_wait() -> None:
    """Catches a watch that measures from the start instead of from the last work seen."""
    tree = Tree()
    watch = tree.watch()
    tree.run(50.0, 0.0)
    assert watch.stalled() is None
    tree.run(5.0, 1.0)  # a burst of loading
    assert watch.stalled() is None
    tree.run(50.0, 0.0)  # 55 s idle since the burst began
    assert watch.stalled() is None
    tree.run(10.0, 0.0)
    assert watch.stalled() is not None


def test_a_stub_that_exits_resets_the_count() -> None:
    """A process that ends takes its CPU time out of the tree's total: that is a change, not a stall."""
    tree = Tree()
    watch = tree.watch()
    tree.run(40.0, 0.0)
    tree.cpu -= 5.0
    assert watch.stalled() is None
    tree.run(40.0, 0.0)
    assert watch.stalled() is None


def test_the_tree_counts_its_childrens_cpu() -> None:
    """Catches a count of the top process alone: a child that burned half a second shows in the tree."""
    child = subprocess.Popen([sys.executable, "-c", BURN])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (proc_stat(child.pid) or ZERO).cpu_s < 0.5:
            time.sleep(0.05)
        own = proc_stat(os.getpid())
        assert own is not None and tree_cpu_s(os.getpid()) - own.cpu_s >= 0.5
    finally:
        child.kill()
        child.wait()
