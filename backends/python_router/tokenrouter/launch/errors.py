"""What a launch raises when tritonserver cannot be found, started or made ready."""

from __future__ import annotations


class TritonError(RuntimeError):
    """The server could not be found, started or made ready; the message says why."""


class StartAborted(TritonError):
    """tritonserver was killed by a signal before it was ready (not a bad repository: that exits
    with a code), or its start stalled (start_watch.py). Seen with the bundled 2.51 on a busy machine:
    an uncaught ``boost::interprocess::lock_exception`` in its Python backend aborts the start (SIGABRT)."""
