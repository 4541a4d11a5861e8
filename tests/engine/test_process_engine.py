"""The engine process behind the embedded API: its environment is the caller's choice, it never
outlives its parent (a killed benchmark once left a 1.5B engine of 11 GB running its last call), and
it lives as long as its parent does, whichever thread started it."""

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


def test_an_engine_started_from_a_thread_outlives_that_thread(tiny_pair):
    """Tests and benchmarks start engines from pool threads that end at once (PR_SET_PDEATHSIG, which
    watches the starting thread, killed every such engine)."""
    import threading

    from tokenrouter.config import ModelSpec
    from tokenrouter.engine.base import StepRow
    from tokenrouter.engine.process_engine import PARENT_POLL_S, EngineProcess

    started: list[EngineProcess] = []
    spec = ModelSpec(path=str(tiny_pair["small"]), engine="torch", kv_cache_tokens=512, max_batch_size=2)
    starter = threading.Thread(target=lambda: started.append(EngineProcess("small", spec)))
    starter.start()
    starter.join()
    (engine,) = started
    try:
        time.sleep(5 * PARENT_POLL_S)
        engine.add_sequence("a")
        assert engine.step([StepRow("a", [5, 6, 7])]).positions.tolist() == [3]
    finally:
        engine.close()
