"""`tokenrouter serve` as a user runs it: ready, answers, and stops cleanly on SIGINT/SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from tokenrouter.client import http_generate
from tokenrouter.launch.processes import process_alive
from tokenrouter.launch.triton_server import Ports
from tokenrouter.openai_server.app import API_KEY_ENV

from helpers.launcher import descendants, launch, stop_and_check, triton_pid
from helpers.servers import render_echo_repository


def test_serve_runs_a_repository_and_stops_on_sigint_without_orphans(tiny_tokenizer: Path, tmp_path: Path) -> None:
    """Ctrl-C; SIGTERM's stop without orphans is test_serve_tiny_routes_between_both_models's last step."""
    repo = render_echo_repository(tmp_path / "repo", tiny_tokenizer)
    launcher, ports = launch("--model-repository", str(repo))
    try:
        server_pids = descendants(launcher.pid)
        assert len(server_pids) >= 4, "expected tritonserver and a stub per Python model"
        reply = http_generate(f"127.0.0.1:{ports.http}", {"text_input": "hello", "exclude_input_in_output": True})
        assert reply["text_output"] == "hello"
        stop_and_check(launcher, signal.SIGINT, server_pids)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def test_a_killed_launcher_takes_the_server_with_it(tiny_tokenizer: Path, tmp_path: Path) -> None:
    launcher, _ = launch("--model-repository", str(render_echo_repository(tmp_path / "repo", tiny_tokenizer)))
    server_pids = descendants(launcher.pid)
    launcher.kill()  # no handler runs: the server learns it from PR_SET_PDEATHSIG
    launcher.wait()
    deadline = time.monotonic() + 30
    while any(process_alive(pid) for pid in server_pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(process_alive(pid) for pid in server_pids)


def test_serve_tiny_routes_between_both_models(tmp_path: Path) -> None:
    """--tiny renders configs/tiny.yaml with the tiny pair (here into tmp_path) and serves it, over
    Triton and over the OpenAI API beside it (with the key of TOKENROUTER_API_KEY); a killed OpenAI
    server is restarted alone, Triton untouched."""
    launcher, ports = launch("--tiny", "--model-repository", str(tmp_path / "repo"), env={API_KEY_ENV: "k-1"})
    try:
        server_pids = descendants(launcher.pid)
        reply = http_generate(f"127.0.0.1:{ports.http}", {"text_input": "def add(a, b):", "max_tokens": 24})
        assert reply["finish_reason"] == "length" and len(reply["output_ids"]) == 24
        assert set(reply["output_models"]) == {"slm", "llm"}  # random policy, rate 0.3: both write
        assert 0.0 < reply["large_model_share"] < 1.0
        api = openai.OpenAI(base_url=f"http://127.0.0.1:{launcher.openai_port}/v1", api_key="k-1", max_retries=0)
        chat = api.chat.completions.create(model="tokenrouter", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=24, temperature=0)
        assert chat.usage.completion_tokens == 24 and 0.0 < chat.choices[0].large_model_share < 1.0
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=api.base_url, api_key="wrong", max_retries=0).models.list()
        (api_pid,) = [pid for pid in server_pids
                      if b"tokenrouter.openai_server" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        triton = triton_pid(launcher.pid)
        os.kill(api_pid, signal.SIGKILL)
        lines = []
        for line in launcher.stdout:  # the supervisor's account of it
            lines.append(line)
            if "the OpenAI server is ready again" in line:
                break
        assert any("the OpenAI server exited with code -9; restarting it" in line for line in lines), lines[-20:]
        assert api.completions.create(model="tokenrouter", prompt="x", max_tokens=3).usage.completion_tokens == 3
        assert process_alive(triton) and triton_pid(launcher.pid) == triton and not process_alive(api_pid)
        stop_and_check(launcher, signal.SIGTERM, descendants(launcher.pid) + server_pids)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def test_serve_reports_a_model_that_cannot_load(tiny_tokenizer: Path, tmp_path: Path) -> None:
    repo = render_echo_repository(tmp_path / "repo", tmp_path / "no-such-tokenizer")
    ports = Ports.free()
    done = subprocess.run(
        [sys.executable, "-m", "tokenrouter.launch.cli", "serve", "--model-repository", str(repo),
         f"--http-port={ports.http}", f"--grpc-port={ports.grpc}", f"--metrics-port={ports.metrics}"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert "exited with code 1 before it was ready; last log lines:" in done.stderr
    assert "no-such-tokenizer" in done.stderr.split("last log lines:")[1]
