"""Waiting in a test for something another thread does, in bounded time."""

from __future__ import annotations

import time
from typing import Callable


def wait_for(condition: Callable[[], object], timeout_s: float = 5.0) -> None:
    """Until ``condition()`` is true; fails the test ("timed out") after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)
