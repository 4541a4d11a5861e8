"""`tokenrouter serve` as a user runs it: ready, answers, a killed launcher leaves no server, a model
that cannot load is reported. (`serve --tiny` with its OpenAI server, and Ctrl-C, are test_installed_package's:
the installed command; SIGTERM's drain and stop are tests/reliability/test_shutdown.py's.)"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


from tokenrouter.client import http_generate
from tokenrouter.launch.processes import process_alive
from tokenrouter.launch.triton_server import Ports

from helpers.launcher import descendants, launch
from helpers.servers import render_lean_echo_repository


def test_serve_runs_a_repository_and_a_killed_launcher_takes_the_server_with_it(tiny_tokenizer: Path,
                                                                                 tmp_path: Path) -> None:
    """Ready, answers, and a launcher killed outright (no handler runs) takes its server: the server
    learns it from PR_SET_PDEATHSIG. The stops by signal without orphans are other tests' last steps:
    Ctrl-C test_installed_package's (the installed `serve --tiny`), SIGTERM test_shutdown's."""
    repo = render_lean_echo_repository(tmp_path / "repo", tiny_tokenizer)
    launcher, ports = launch("--model-repository", str(repo))
    try:
        server_pids = descendants(launcher.pid)
        assert len(server_pids) >= 3, "expected tritonserver and a stub per Python model"
        reply = http_generate(f"127.0.0.1:{ports.http}", {"text_input": "hello", "exclude_input_in_output": True})
        assert reply["text_output"] == "hello"
    finally:
        launcher.kill()
        launcher.wait()
    deadline = time.monotonic() + 30
    while any(process_alive(pid) for pid in server_pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(process_alive(pid) for pid in server_pids)


def test_serve_reports_a_model_that_cannot_load(tiny_tokenizer: Path, tmp_path: Path) -> None:
    repo = render_lean_echo_repository(tmp_path / "repo", tmp_path / "no-such-tokenizer")
    ports = Ports.free()
    done = subprocess.run(
        [sys.executable, "-m", "tokenrouter.launch.cli", "serve", "--model-repository", str(repo),
         f"--http-port={ports.http}", f"--grpc-port={ports.grpc}", f"--metrics-port={ports.metrics}"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert "exited with code 1 before it was ready; last log lines:" in done.stderr
    assert "no-such-tokenizer" in done.stderr.split("last log lines:")[1]
