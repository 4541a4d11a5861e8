"""CPU time spent by this process and by the processes of another group (a Triton server and its stubs).

On a machine with two shared cores, CPU per output token decides throughput as much as any
scheduling does; the served-vs-embedded comparison reports it for both paths, and for the served
path per process (tritonserver itself, and each Python stub by the model it runs).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path


def _stub_model(cmdline: list[str]) -> str | None:
    """The model a Python backend stub runs: its first argument is <repository>/<model>/<version>/model.py."""
    if not cmdline or not cmdline[0].endswith("triton_python_backend_stub") or len(cmdline) < 2:
        return None
    parts = Path(cmdline[1]).parts
    return parts[-3] if len(parts) >= 3 else cmdline[1]


def group_cpu_by_process(pgid: int) -> dict[str, float]:
    """User + system CPU seconds of the live processes in process group ``pgid`` (Linux /proc), by
    process: a stub under its model's name, anything else under its command name."""
    seconds: Counter = Counter()
    hz = os.sysconf("SC_CLK_TCK")
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            comm, rest = (proc / "stat").read_text().rsplit(")", 1)
            fields = rest.split()  # after "pid (comm)": state, ppid, pgrp, ...
            if int(fields[2]) != pgid:
                continue
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except (OSError, IndexError, ValueError):
            continue  # the process ended while we looked
        name = _stub_model(cmdline) or comm.split("(", 1)[1]
        seconds[name] += (int(fields[11]) + int(fields[12])) / hz  # utime, stime
    return dict(seconds)


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU of the live processes in process group ``pgid``."""
    return sum(group_cpu_by_process(pgid).values())


def own_cpu_seconds() -> float:
    """CPU of this process, all threads."""
    return time.process_time()
