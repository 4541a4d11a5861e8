"""Processes as /proc shows them: the Python-backend stubs of a tritonserver, whether a pid runs; and
the setting that ties a launched child's life to the launcher's."""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
from pathlib import Path

from tokenrouter.procfs import proc_stat

from .errors import TritonError


def stub_pids(server_pid: int) -> dict[str, int]:
    """Model name -> pid of its Python-backend stub, among the children of tritonserver ``server_pid``."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        stat = proc_stat(proc.name)
        if stat is None or stat.ppid != server_pid:
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) > 1 and argv[0].endswith(b"triton_python_backend_stub"):
            found[Path(argv[1].decode()).parts[-3]] = int(proc.name)  # <repo>/<model>/<version>/model.py
    return found


def started(process: subprocess.Popen[str] | None, what: str) -> subprocess.Popen[str]:
    """``process``, which ``what``'s start made; asking before the start is a mistake of the caller."""
    if process is None:
        raise TritonError(f"{what} is not started")
    return process


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    stat = proc_stat(pid)
    return stat is not None and stat.state not in ("Z", "X")


# looked up here, not in the forked child, where taking the loader's lock could deadlock
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def die_with_parent() -> None:
    """In the child: get SIGTERM when the launching thread dies, even by SIGKILL (Linux only)."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
