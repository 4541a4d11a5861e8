"""torch's intra-op thread count for an engine. It is per OS thread: set once in each thread that steps the engine."""

from __future__ import annotations

import threading

import torch


class IntraOpThreads:
    def __init__(self, threads: int | None) -> None:
        """``threads``: None leaves torch's default."""
        self.threads = threads
        self._state = threading.local()

    def apply(self) -> None:
        """Call at the start of every step: only the first call in a thread changes anything."""
        if self.threads and not getattr(self._state, "done", False):
            torch.set_num_threads(self.threads)
            self._state.done = True
