"""The rank watch: when one rank of a tensor-parallel model dies, the others (stuck in a collective with
it, deaf to SIGTERM) are killed at once; a close, where every rank is told to exit, is left alone."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import pytest

from tokenrouter.engine.rank_watch import kill_all_when_one_dies

GONE_WITHIN_S = 5.0  # the watch acts on the death itself; the bound only keeps a broken watch from hanging


def _stuck_rank(link: Connection) -> None:
    """A rank waiting in a collective: a SIGTERM does not end it. It answers each ping (the test's way
    to see that it lives)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        link.send(link.recv())


@pytest.fixture
def ranks() -> Iterator[list[tuple[BaseProcess, Connection]]]:
    context = multiprocessing.get_context("fork")
    started = []
    for i in range(3):
        ours, theirs = context.Pipe()
        process = context.Process(target=_stuck_rank, args=(theirs,), name=f"rank-{i}", daemon=True)
        process.start()
        theirs.close()  # the rank's end lives in the rank alone: its death is an end of file here
        started.append((process, ours))
    yield started
    for process, _ in started:
        process.kill()
        process.join()


def test_a_dead_rank_takes_the_others_with_it(ranks):
    processes = [process for process, _ in ranks]
    watch = kill_all_when_one_dies("llm", processes, closing=lambda: False)
    killed_at = time.monotonic()
    os.kill(processes[1].pid, signal.SIGKILL)
    watch.join(GONE_WITHIN_S)
    for process in processes:
        process.join(max(0.0, killed_at + GONE_WITHIN_S - time.monotonic()))
    assert not watch.is_alive()
    assert [process.exitcode for process in processes] == [-signal.SIGKILL] * 3


def test_a_close_is_left_alone(ranks):
    """The ranks of an engine being closed exit one by one: the watch must not kill the rest mid-exit."""
    watch = kill_all_when_one_dies("llm", [process for process, _ in ranks], closing=lambda: True)
    os.kill(ranks[0][0].pid, signal.SIGKILL)
    watch.join(GONE_WITHIN_S)
    assert not watch.is_alive()
    # Whatever the watch did is done: a rank it killed cannot answer (its end of the link closes).
    for _, link in ranks[1:]:
        link.send("ping")
        assert link.poll(GONE_WITHIN_S) and link.recv() == "ping"
