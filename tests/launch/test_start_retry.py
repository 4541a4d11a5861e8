"""The launcher's start: a tritonserver killed by a signal before it is ready is started again;
one that exits with a code (a repository that cannot load) is not; one that never gets ready is
stopped with everything it started.

The stand-in binary (helpers/stand_in_triton.py) plays tritonserver's part as the launcher sees it from outside (a
process that dies, or answers /v2/health/ready on its HTTP port); what is tested is the
launcher's retry rule, not Triton.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from helpers.stand_in_triton import write_stand_in
from tokenrouter.launch.errors import StartAborted, TritonError
from tokenrouter.launch.processes import process_alive
from tokenrouter.launch.triton_install import TritonInstall
from tokenrouter.launch.triton_server import START_ATTEMPTS, Ports, TritonServer

def _server(tmp_path: Path, *, aborts: int, exit_code: int = 0, sig: str = "SIGABRT",
            hang: bool = False, busy_s: float = 0.0) -> tuple[TritonServer, Path]:
    runs = tmp_path / "runs"
    binary = write_stand_in(tmp_path / "tritonserver", runs, aborts=aborts, exit_code=exit_code, signal=sig,
                            hang=hang, busy_s=busy_s)
    install = TritonInstall(binary=binary, backends=tmp_path)
    return TritonServer(tmp_path, tmp_path, install, Ports.free()), runs


def test_a_start_that_aborts_is_made_again_until_it_is_ready(tmp_path: Path) -> None:
    """Catches a launcher that gives up on the first abort (the issue's exit -6 at startup)."""
    server, runs = _server(tmp_path, aborts=START_ATTEMPTS - 1)
    said: list[str] = []
    ready = server.start_ready(30, say=said.append)
    try:
        assert ready.is_ready() and len(runs.read_text()) == START_ATTEMPTS
        assert len(said) == START_ATTEMPTS - 1 and all("exited with code -6" in line for line in said)
        assert server.process.poll() is not None  # the aborted first process is gone
    finally:
        ready.stop()


def test_aborting_every_time_gives_up_after_the_last_attempt(tmp_path: Path) -> None:
    server, runs = _server(tmp_path, aborts=START_ATTEMPTS, sig="SIGSEGV")
    with pytest.raises(StartAborted, match="exited with code -11 before it was ready"):
        server.start_ready(30)
    assert len(runs.read_text()) == START_ATTEMPTS


def test_a_start_that_exits_with_a_code_is_not_made_again(tmp_path: Path) -> None:
    """Catches a retry of a repository that cannot load: the same error three times, three times slower."""
    server, runs = _server(tmp_path, aborts=0, exit_code=1)
    with pytest.raises(TritonError, match="exited with code 1 before it was ready") as raised:
        server.start_ready(30)
    assert not isinstance(raised.value, StartAborted) and runs.read_text() == "x"


def test_a_start_that_never_gets_ready_leaves_no_process(tmp_path: Path) -> None:
    """Catches a timed-out start whose processes stay behind (a test fixture's failed start left
    ~0.5 GB per stub running): the server and its child are gone when the error is raised."""
    server, runs = _server(tmp_path, aborts=0, hang=True)
    with pytest.raises(TritonError, match="not ready after 2 s"):
        server.start_ready(2)
    child = int(Path(f"{runs}.child").read_text())
    assert server.process.poll() is not None
    deadline = time.monotonic() + 5  # SIGKILLed with the group; reaped by init
    while process_alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process_alive(child)


def test_a_start_says_how_long_tritonserver_and_the_models_took(monkeypatch: pytest.MonkeyPatch) -> None:
    """The restart time split the supervisor logs: tritonserver's own start (to its first model's
    load), the models' loading (to the last one loaded), and the wait for readiness after that."""
    from tokenrouter.launch import triton_server

    clock = iter([0.0, 1.5, 9.0, 14.0, 14.5])
    monkeypatch.setattr(triton_server.time, "monotonic", lambda: next(clock))
    times = triton_server.StartTimes()  # started at 0.0
    times.see('I1204 16:23:36.19 model_lifecycle.cc:472] "loading: slm:1"')  # 1.5
    times.see('I1204 16:23:36.19 model_lifecycle.cc:472] "loading: llm:1"')  # not the first: no clock read
    times.see("I1204 16:24:26.47 model_lifecycle.cc:839] \"successfully loaded 'llm'\"")  # 9.0
    times.see("I1204 16:25:11.96 model_lifecycle.cc:839] \"successfully loaded 'slm'\"")  # 14.0
    times.ready = next(clock)  # 14.5
    assert times.summary() == ("14.5 s: tritonserver 1.5 s, loading the models 12.5 s (the last, slm), "
                               "ready 0.5 s later")


def test_a_start_that_stalls_idle_is_made_again(tmp_path: Path) -> None:
    """Catches a launcher that waits out the whole ready timeout on a hung start (a stub stuck idle in
    its load, docs/reliability.md): an idle, unready tree is stopped and started again, each time."""
    server, runs = _server(tmp_path, aborts=0, hang=True)
    server.start_stall_s = 1.0
    said: list[str] = []
    started = time.monotonic()
    with pytest.raises(StartAborted, match="start stalled"):
        server.start_ready(60, say=said.append)
    assert len(runs.read_text()) == START_ATTEMPTS and time.monotonic() - started < 30
    assert len(said) == START_ATTEMPTS - 1 and all("start stalled" in line for line in said)


def test_a_start_that_loads_for_longer_than_the_stall_bound_is_not_stalled(tmp_path: Path) -> None:
    """Catches a watch that takes a slow start for a hung one: 3 s of CPU before ready, a 1 s bound."""
    server, runs = _server(tmp_path, aborts=0, busy_s=3.0)
    server.start_stall_s = 1.0
    ready = server.start_ready(60)
    try:
        assert ready.is_ready() and runs.read_text() == "x"
    finally:
        ready.stop()
