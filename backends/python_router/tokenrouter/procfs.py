"""A process's line of Linux's ``/proc/<pid>/stat``, parsed in one place for whoever reads it
(the launcher finding and watching stubs, the peer secret's file name, CPU accounting, the tests).

The command name (field 2) is in parentheses and may itself hold spaces and parentheses, so the
fields are read after the *last* ``)``; their numbers are those of proc(5).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcStat:
    comm: str  # the command name, at most 15 bytes (not the command line)
    state: str  # R running, S sleeping, D disk wait, Z zombie, X dead, ...
    ppid: int
    pgrp: int
    cpu_s: float  # user + system CPU seconds, all threads
    start_ticks: int  # start time, in clock ticks after boot: a pid and this name one process


def proc_stat(pid: int | str) -> ProcStat | None:
    """``pid``'s stat line, None when there is no such process (or it ended while being read)."""
    try:
        head, rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)
        fields = rest.split()  # fields 3 (state) and on
        return ProcStat(comm=head.split("(", 1)[1], state=fields[0], ppid=int(fields[1]), pgrp=int(fields[2]),
                        cpu_s=(int(fields[11]) + int(fields[12])) / _TICKS_PER_S,
                        start_ticks=int(fields[19]))
    except (OSError, ValueError, IndexError):
        return None


def child_pids(pid: int | str) -> list[int]:
    """``pid``'s children (Linux's ``/proc/<pid>/task/<tid>/children`` of each of its threads); [] when it is gone."""
    children: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            children += [int(child) for child in (task / "children").read_text().split()]
    except OSError:
        return []
    return sorted(children)


def group_members(pgid: int) -> dict[int, ProcStat]:
    """The live processes of process group ``pgid`` (a server started in its own session, with its
    stubs and their workers), pid -> stat line."""
    members = {}
    for proc in Path("/proc").glob("[0-9]*"):
        stat = proc_stat(proc.name)
        if stat is not None and stat.pgrp == pgid:
            members[int(proc.name)] = stat
    return members


def group_cpu_s(pgid: int) -> float:
    """User + system CPU seconds used so far by the live processes of process group ``pgid``."""
    return sum(stat.cpu_s for stat in group_members(pgid).values())
