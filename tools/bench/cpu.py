"""CPU time spent by this process and by the processes of another group (a Triton server and its stubs).

On a machine with two shared cores, CPU per output token decides throughput as much as any
scheduling does; the served-vs-embedded comparison reports it for both paths, and for the served
path per process (tritonserver itself, and each Python stub by the model it runs).
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

from tokenrouter.procfs import group_members


def _stub_model(cmdline: list[str]) -> str | None:
    """The model a Python backend stub runs: its first argument is <repository>/<model>/<version>/model.py."""
    if not cmdline or not cmdline[0].endswith("triton_python_backend_stub") or len(cmdline) < 2:
        return None
    parts = Path(cmdline[1]).parts
    return parts[-3] if len(parts) >= 3 else cmdline[1]


def group_cpu_by_process(pgid: int) -> dict[str, float]:
    """User + system CPU seconds of the live processes in process group ``pgid`` (Linux /proc), by
    process: a stub under its model's name, anything else under its command name."""
    seconds: defaultdict[str, float] = defaultdict(float)
    for pid, stat in group_members(pgid).items():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue  # the process ended while we looked
        seconds[_stub_model(cmdline) or stat.comm] += stat.cpu_s
    return dict(seconds)


def own_cpu_seconds() -> float:
    """CPU of this process, all threads."""
    return time.process_time()
