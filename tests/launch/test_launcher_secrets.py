"""What the launcher hands tritonserver (launch/triton_server.py), without Triton: no client can load
or unload a model (model control "none"), and no key or secret is on any command line or in any
environment of the processes under the server. /proc/<pid>/cmdline is readable by every local user, and
whatever a stub starts inherits its environment; a key on tritonserver's command line once let any
local user load code into the server.

The stand-in binary (helpers/stand_in_triton.py) plays tritonserver's part as the launcher sees it from
outside: it answers /v2/health/ready and starts a child (as a stub is) that stays up."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from helpers.launcher import descendants
from helpers.stand_in_triton import write_stand_in
from tokenrouter.launch.triton_install import TritonInstall
from tokenrouter.launch.triton_server import MODEL_CONTROL, Ports, TritonServer
from tokenrouter.openai_server.app import API_KEY_ENV
from tokenrouter.serving.pair_secret import PAIR_SECRET_ENV, PAIR_SECRET_FILE_ENV
from tokenrouter.serving.peer_auth import secret_path

API_KEY, PAIR_SECRET = "api-key-" + "a" * 32, "pair-secret-" + "p" * 32

@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    binary = write_stand_in(tmp_path / "tritonserver", tmp_path / "runs")
    monkeypatch.setenv(API_KEY_ENV, API_KEY)
    monkeypatch.setenv(PAIR_SECRET_ENV, PAIR_SECRET)
    monkeypatch.delenv(PAIR_SECRET_FILE_ENV, raising=False)
    server = TritonServer(tmp_path, tmp_path, TritonInstall(binary=binary, backends=tmp_path), Ports.free())
    server.start().wait_ready(60)
    yield server
    server.stop(grace_s=2)


def test_the_command_closes_model_control_and_carries_no_key() -> None:
    command = TritonServer(Path("repo"), Path("backends"), TritonInstall(Path("tritonserver"), Path(".")),
                           Ports(1, 2, 3)).command()
    assert MODEL_CONTROL == "--model-control-mode=none" and MODEL_CONTROL in command
    assert not [arg for arg in command if arg.startswith(("--load-model", "--model-control-mode=explicit",
                                                          "--http-restricted-api", "--grpc-restricted-protocol"))]


def test_no_process_under_the_server_has_a_secret_in_its_cmdline_or_environ(server: TritonServer) -> None:
    processes = [server.process.pid, *descendants(server.process.pid)]
    assert len(processes) >= 2, "the stand-in's child is missing"
    secrets = [API_KEY, PAIR_SECRET, server.peer_secret]
    for pid in processes:
        for part in ("cmdline", "environ"):
            text = Path(f"/proc/{pid}/{part}").read_bytes()
            assert not [s for s in secrets if s.encode() in text], f"a secret is in /proc/{pid}/{part}"


def test_the_pair_secret_reaches_the_stubs_as_a_private_file_removed_at_stop(server: TritonServer) -> None:
    environ = dict(item.split(b"=", 1) for item in Path(f"/proc/{server.process.pid}/environ").read_bytes()
                   .split(b"\0") if b"=" in item)
    path = Path(environ[PAIR_SECRET_FILE_ENV.encode()].decode())
    assert path.read_text() == PAIR_SECRET
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    server.stop(grace_s=2)
    assert not path.exists()



@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser"), reason="needs root to act as user nobody")
def test_as_another_local_user_no_secret_can_be_read(server: TritonServer) -> None:
    """What the attacker of the old design did, as user ``nobody``: every cmdline under the server is
    readable and holds no secret; the environments and the secret files are not readable at all."""
    environ = Path(f"/proc/{server.process.pid}/environ").read_bytes().split(b"\0")
    pair_file = next(item.split(b"=", 1)[1].decode() for item in environ if item.startswith(b"TOKENROUTER_PAIR"))
    peer_file = str(secret_path(server.process.pid))

    def as_nobody(path: str) -> subprocess.CompletedProcess:
        return subprocess.run(["runuser", "-u", "nobody", "--", "cat", path], capture_output=True, timeout=30)

    for pid in [server.process.pid, *descendants(server.process.pid)]:
        cmdline = as_nobody(f"/proc/{pid}/cmdline")
        assert cmdline.returncode == 0 and (b"tritonserver" in cmdline.stdout or b"sleep" in cmdline.stdout)
        assert not [s for s in (API_KEY, PAIR_SECRET, server.peer_secret) if s.encode() in cmdline.stdout]
        assert as_nobody(f"/proc/{pid}/environ").returncode != 0
    for path in (pair_file, peer_file):
        assert Path(path).exists() and as_nobody(path).returncode != 0, path


class _RecordingPopen:
    """Stands in for subprocess.Popen in openai_process: records the command and the environment."""

    started: list["_RecordingPopen"] = []

    def __init__(self, args: list[str], env: dict[str, str], **_: object) -> None:
        self.args, self.env, self.returncode = args, env, 0
        self.stdout = iter(())
        _RecordingPopen.started.append(self)

    def poll(self) -> int:
        return 0

    def wait(self, timeout: float | None = None) -> int:
        return 0

    def send_signal(self, _signal: int) -> None:
        pass


def test_the_openai_server_gets_its_key_in_a_private_file_never_in_its_command_line_or_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenrouter.launch import openai_process

    monkeypatch.setattr(openai_process.subprocess, "Popen", _RecordingPopen)
    monkeypatch.setenv(API_KEY_ENV, API_KEY)  # the caller's environment must not reach the child either
    server = openai_process.OpenAIServer(tmp_path, "127.0.0.1:1", port=19999, api_key=API_KEY).start()
    child = _RecordingPopen.started[-1]
    assert not [arg for arg in child.args if API_KEY in arg]
    assert not [value for value in child.env.values() if API_KEY in value] and API_KEY_ENV not in child.env
    key_file = Path(next(arg.split("=", 1)[1] for arg in child.args if arg.startswith("--api-key-file=")))
    assert key_file.read_text() == API_KEY and stat.S_IMODE(key_file.stat().st_mode) == 0o600
    server.stop()
    assert not key_file.exists()


def test_read_api_key_takes_the_file_then_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenrouter.openai_server.app import read_api_key

    monkeypatch.setenv(API_KEY_ENV, "from-env")
    (tmp_path / "key").write_text(API_KEY + "\n")
    assert read_api_key(tmp_path / "key") == API_KEY and read_api_key(None) == "from-env"
    (tmp_path / "empty").write_text("")
    for path in (tmp_path / "empty", tmp_path / "missing"):
        with pytest.raises(ValueError, match=str(path)):
            read_api_key(path)
    monkeypatch.delenv(API_KEY_ENV)
    assert read_api_key(None) is None


def test_serve_refuses_a_key_on_its_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from tokenrouter.launch import serve

    parser = argparse.ArgumentParser()
    serve.configure(parser)
    # a config that does not exist: had the key been taken, the run would end there, with another message
    assert serve.run(parser.parse_args(["--api-key", API_KEY, "--config", "/nonexistent.yaml"])) == 2
    assert "--api-key-file" in capsys.readouterr().err
