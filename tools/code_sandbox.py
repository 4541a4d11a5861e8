"""Run untrusted generated code (HumanEval completions) in a sandboxed child process.

Layers, each cheap and none trusted alone:
- a fresh temporary working directory, removed afterwards; an empty environment; ``python -I``
  (no user site, no PYTHON* variables, no script-dir imports);
- resource limits set in the child before exec: address space, CPU seconds, file size, open files;
- no network: a new network namespace (``unshare --net``) where the system allows it, and in any
  case a preamble that makes socket creation and process spawning raise;
- a wall-clock timeout that kills the child's whole process group.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

# Runs before the program in the child. Not a security boundary (the namespace and limits are);
# it turns the commonest accidents (a network call, a subprocess) into a clear failure.
GUARD = """\
import os as _os, socket as _socket, subprocess as _subprocess
def _blocked(*args, **kwargs):
    raise PermissionError("blocked in the code sandbox")
_socket.socket = _socket.create_connection = _socket.socketpair = _blocked
_subprocess.Popen = _subprocess.run = _subprocess.call = _blocked
_os.system = _os.fork = _os.forkpty = _os.kill = _os.killpg = _blocked
del _os, _socket, _subprocess, _blocked
"""
RESULT_MARKER = "__SANDBOX_PASSED__"


@dataclass
class SandboxResult:
    status: str  # passed, failed (exception or non-zero exit), timeout
    detail: str  # the tail of stderr, or what happened
    seconds: float
    output: str = ""  # the tail of stdout

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@lru_cache(maxsize=1)
def network_namespace_prefix() -> tuple[str, ...]:
    """``unshare --net`` when this machine lets us create a network namespace, else nothing."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    try:
        ok = subprocess.run([unshare, "--net", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return (unshare, "--net") if ok else ()


def _limits(memory_mb: int, cpu_s: int) -> None:
    """Runs in the child between fork and exec."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))


def run_program(source: str, *, timeout_s: float = 10.0, memory_mb: int = 1024) -> SandboxResult:
    """Run ``source`` as a Python program in the sandbox; passed = it ran to the end."""
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="tokenrouter-sandbox-"))
    try:
        script = workdir / "program.py"
        script.write_text(GUARD + source + f"\nprint({RESULT_MARKER!r})\n")
        command = [*network_namespace_prefix(), sys.executable, "-I", str(script)]
        child = subprocess.Popen(
            command, cwd=workdir, env={"PATH": "/usr/bin:/bin", "HOME": str(workdir)}, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
            preexec_fn=lambda: _limits(memory_mb, int(timeout_s) + 1))
        try:
            stdout, stderr = child.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            return SandboxResult("timeout", f"no result within {timeout_s:g} s", time.monotonic() - started)
        elapsed = time.monotonic() - started
        if child.returncode == 0 and stdout.rstrip().endswith(RESULT_MARKER):
            return SandboxResult("passed", "", elapsed, stdout[-2000:])
        detail = stderr.strip()[-2000:] or f"exit status {child.returncode}"
        return SandboxResult("failed", detail, elapsed, stdout[-2000:])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def humaneval_program(problem: dict[str, Any], completion: str) -> str:
    """The program HumanEval judges: prompt + completion, the problem's tests, and the check call."""
    return f"{problem['prompt']}{completion}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"


def check_completion(problem: dict[str, Any], completion: str, *, timeout_s: float = 10.0,
                     memory_mb: int = 1024) -> SandboxResult:
    """Does ``completion`` (the function body after the prompt) pass the problem's tests?"""
    return run_program(humaneval_program(problem, completion), timeout_s=timeout_s, memory_mb=memory_mb)
