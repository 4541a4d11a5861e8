"""The engine process behind the embedded API: its environment is the caller's choice, and it never
outlives its parent (a killed benchmark once left a 1.5B engine of 11 GB running its last call)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PARENT = r'''
import os, sys, time
from tokenrouter.config import ModelSpec
from tokenrouter.engine.process_engine import EngineProcess

engine = EngineProcess("small", ModelSpec(path=sys.argv[1], engine="torch", kv_cache_tokens=512, max_batch_size=2),
                       env={**os.environ, "TOKENROUTER_TEST_MARK": "from-the-caller"})
print(engine._process.pid, flush=True)
time.sleep(120)
'''


def _state(pid: int) -> str | None:
    """The process's state letter (Z: dead, waiting to be reaped), None when it is gone."""
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def test_a_killed_parent_takes_its_engine_process_with_it(tiny_pair):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tiny_pair["small"])], stdout=subprocess.PIPE,
                              text=True)
    child = int(parent.stdout.readline())
    child_env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
    assert b"TOKENROUTER_TEST_MARK=from-the-caller" in child_env  # the env given, not the parent's own
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 5
    while _state(child) not in (None, "Z") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _state(child) in (None, "Z"), f"engine process {child} still runs after its parent was killed"


def test_an_engine_started_from_a_thread_that_ends_keeps_running(tiny_pair):
    """The engine lives as long as the process that started it, not the thread (test fixtures and the
    embedded API start engines from thread pools; Linux's parent-death signal follows the thread)."""
    import threading

    from tokenrouter.config import ModelSpec
    from tokenrouter.engine.base import StepRow
    from tokenrouter.engine.process_engine import EngineProcess

    made = []
    thread = threading.Thread(target=lambda: made.append(EngineProcess(
        "small", ModelSpec(path=str(tiny_pair["small"]), engine="torch", kv_cache_tokens=512, max_batch_size=2))))
    thread.start()
    thread.join()
    engine = made[0]
    try:
        time.sleep(1.5)  # past the child's look at its parent
        engine.add_sequence(0)
        assert len(engine.step([StepRow(0, [1, 2, 3])]).seq_ids) == 1
    finally:
        engine.close()
