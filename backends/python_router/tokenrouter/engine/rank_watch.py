"""A tensor-parallel model whose rank died is ended at once, every rank of it.

The ranks of a model meet in a collective at every layer. When one dies, the others wait in that
collective for it forever (vLLM's CPU backend spins on shared memory; nothing there notices a dead
peer), and a SIGTERM cannot reach Python code stuck in it. vLLM's multiprocess executor does see the
death, but it then waits ``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS`` (5 s) for the survivors to exit,
SIGTERMs them, waits 4 s more and only then kills them and wakes the step blocked on their replies:
about 10 s in which the model answers nothing and the server still says it is ready. And if the
process above the ranks exits meanwhile (a Triton stub ends itself when its model is lost), nobody
is left to kill the survivors: they spin on, orphaned.

The survivors of a dead rank can never compute again, so there is nothing to wait for: the watch
kills them the moment one rank exits. vLLM's own shutdown then finds every rank gone at its first
look and fails the blocked step within a tenth of a second.
"""

from __future__ import annotations

import logging
import threading
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import Callable, Sequence

log = logging.getLogger(__name__)


def kill_all_when_one_dies(name: str, ranks: Sequence[BaseProcess], closing: Callable[[], bool]) -> threading.Thread:
    """Watch ``ranks`` (this process's children) from a daemon thread: when one exits while
    ``closing()`` is false, kill the others. A close (every rank told to exit) is left alone."""
    def watch() -> None:
        ended = wait([rank.sentinel for rank in ranks])
        if closing():
            return
        # A sentinel closes as the process exits, before it can be reaped: is_alive may still say True.
        dead = [rank for rank in ranks if rank.sentinel in ended]
        log.error("model %s: rank process %s died; killing its other ranks (they cannot compute without it)",
                  name, ", ".join(rank.name for rank in dead))
        for rank in ranks:
            if rank not in dead:
                rank.kill()

    thread = threading.Thread(target=watch, daemon=True, name=f"{name}-rank-watch")
    thread.start()
    return thread
