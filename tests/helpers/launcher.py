"""`tokenrouter serve` run as a user runs it, in a subprocess on free ports, and the processes below it (/proc)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tokenrouter.config import load_config
from tokenrouter.launch.free_ports import free_port
from tokenrouter.launch.serve import TINY_CONFIG, TINY_FAMILY, TINY_SEED
from tokenrouter.launch.processes import process_alive
from tokenrouter.launch.triton_server import Ports
from tokenrouter.procfs import proc_stat
from tokenrouter.serving.repository import render_repository
from tokenrouter_engines.tiny import ensure_tiny_pair


def descendants(pid: int) -> list[int]:
    """All processes below ``pid`` (from /proc): tritonserver and its Python stubs."""
    below = children(pid)
    return below + [d for child in below for d in descendants(child)]


def children(pid: int) -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir()
            if entry.name.isdigit() and (stat := proc_stat(entry.name)) is not None and stat.ppid == pid]


def triton_pid(launcher_pid: int) -> int:
    """The tritonserver the launcher runs now (its other child is the OpenAI server)."""
    return next(pid for pid in children(launcher_pid)
                if Path(f"/proc/{pid}/comm").read_text().strip() == "tritonserver")


def tiny_repository(out: Path) -> Path:
    """What `tokenrouter serve --tiny --model-repository out` renders, with one front (tokenrouter) in
    place of three: two stubs fewer per start (each loads a tokenizer, ~4 s of CPU), for the tests of
    the server's life (drain, faults, reload, loop death) that call no other front. --tiny itself:
    test_installed_package.py (the installed command)."""
    raw = load_config(TINY_CONFIG).model_dump()
    pair = ensure_tiny_pair(TINY_FAMILY, TINY_SEED)
    raw["models"]["slm"]["path"], raw["models"]["llm"]["path"] = str(pair["small"]), str(pair["large"])
    raw["frontend"].update(names=["tokenrouter"], one_token_per_response=[])
    return render_repository(raw, out)


def launch(*args: str, python: str = sys.executable, cwd: Path | None = None,
            env: dict[str, str] | None = None, command: list[str] | None = None) -> tuple[subprocess.Popen, Ports]:
    """`tokenrouter serve ARGS` on free ports, returned once it says it is ready (the OpenAI server's
    port: ``launcher.openai_port``). ``command``: the launcher to run (default: ``python -m`` its module);
    ``env`` is added to this process's environment."""
    ports, openai_port = Ports.free(), free_port()
    launcher = subprocess.Popen(
        # --ready-timeout: the tiny pair starts in under a minute here; a start seen hanging once
        # (docs/reliability.md, known limits) then fails in 5 minutes with the log, not at pytest's timeout
        [*(command or [python, "-m", "tokenrouter.launch.cli"]), "serve", *args, f"--http-port={ports.http}",
         f"--grpc-port={ports.grpc}", f"--metrics-port={ports.metrics}", f"--openai-port={openai_port}",
         "--triton-arg=--exit-timeout-secs=5",
         *(["--ready-timeout=300"] if not any(a.startswith("--ready-timeout") for a in args) else [])],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
        env=None if env is None else {**os.environ, **env})
    launcher.openai_port = openai_port
    lines: list[str] = []
    for line in launcher.stdout:  # forwarded server log, then the ready line
        lines.append(line)
        if "tokenrouter serve: ready" in line:
            return launcher, ports
    launcher.wait()
    pytest.fail("serve exited before ready:\n" + "".join(lines[-30:]))


def stop(launcher: subprocess.Popen, timeout_s: float = 60) -> None:
    """SIGTERM, as an operator stops it; killed with its children (a fleet's workers run in sessions of
    their own) if it has not exited within ``timeout_s``."""
    launcher.send_signal(signal.SIGTERM)
    try:
        launcher.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        for pid in children(launcher.pid):
            os.kill(pid, signal.SIGKILL)
        launcher.kill()
        launcher.wait()


def stop_and_check(launcher: subprocess.Popen, sig: signal.Signals, server_pids: list[int]) -> None:
    launcher.send_signal(sig)
    wait_stopped(launcher, server_pids)


def wait_stopped(launcher: subprocess.Popen, server_pids: list[int], timeout_s: float = 60) -> str:
    """After a stop signal: the launcher exits 0 and no server process outlives it; returns its output."""
    rest, _ = launcher.communicate(timeout=timeout_s)
    assert launcher.returncode == 0, rest[-3000:]
    assert "stopping tritonserver" in rest
    deadline = time.monotonic() + 10
    while any(process_alive(pid) for pid in server_pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(process_alive(pid) for pid in server_pids)
    return rest


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def seconds_until_not_ready(url: str, since: float, until: float) -> float | None:
    """Seconds from ``since`` to the first answer of ``url`` other than 200 (an answer that takes over
    a second counts when it times out, as a health check's would); None if it stayed 200 ``until``."""
    while time.monotonic() < until:
        try:
            with urllib.request.urlopen(url, timeout=1.0) as reply:
                ready = reply.status == 200
        except (urllib.error.URLError, OSError):  # 503, refused, timed out
            ready = False
        if not ready:
            return time.monotonic() - since
        time.sleep(0.01)
    return None
