"""The stall rule of a start (launch/start_watch.py) on a made-up clock and CPU counter; the
launcher's use of it against a stand-in binary is in test_start_retry.py."""

from __future__ import annotations

from tokenrouter.launch.start_watch import IDLE_SHARE, StallWatch


class Group:
    """A clock and a process group's CPU counter that the test moves."""

    def __init__(self) -> None:
        self.now, self.cpu = 0.0, 10.0

    def watch(self, stall_s: float = 60.0) -> StallWatch:
        return StallWatch(1, stall_s, clock=lambda: self.now, cpu_s=lambda pid: self.cpu)

    def run(self, seconds: float, cpu_share: float) -> None:
        self.now += seconds
        self.cpu += seconds * cpu_share


def test_an_idle_group_is_stalled_after_the_bound_and_not_before() -> None:
    group = Group()
    watch = group.watch()
    group.run(59.0, IDLE_SHARE / 2)
    assert watch.stalled() is None
    group.run(1.0, IDLE_SHARE / 2)
    assert "start stalled" in (watch.stalled() or "")


def test_a_slow_but_working_start_is_never_stalled() -> None:
    """Five minutes at a tenth of a core (a start starved by other work) never reads as stalled."""
    group = Group()
    watch = group.watch()
    for _ in range(300):
        group.run(1.0, 0.1)
        assert watch.stalled() is None


def test_work_restarts_the_wait() -> None:
    """Catches a watch that measures from the start instead of from the last work seen."""
    group = Group()
    watch = group.watch()
    group.run(50.0, 0.0)
    assert watch.stalled() is None
    group.run(5.0, 1.0)  # a burst of loading
    assert watch.stalled() is None
    group.run(50.0, 0.0)  # 55 s idle since the burst began
    assert watch.stalled() is None
    group.run(10.0, 0.0)
    assert watch.stalled() is not None


def test_a_stub_that_exits_resets_the_count() -> None:
    """A process that ends takes its CPU time out of the group's total: that is a change, not a stall."""
    group = Group()
    watch = group.watch()
    group.run(40.0, 0.0)
    group.cpu -= 5.0
    assert watch.stalled() is None
    group.run(40.0, 0.0)
    assert watch.stalled() is None
