"""CPU time spent by this process and by another process group (a Triton server and its stubs).

On a machine with two shared cores, CPU per output token decides throughput as much as any
scheduling does; the served-vs-embedded comparison reports it for both paths.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU of the live processes in process group ``pgid`` (Linux /proc)."""
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
        except (OSError, IndexError):
            continue  # the process ended while we looked
        if int(fields[2]) == pgid:
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU of this process, all threads."""
    return time.process_time()
