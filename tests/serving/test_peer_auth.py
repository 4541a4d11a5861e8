"""The peer secret: one per server start, in a private file, the same for the launcher and every
stub of that start, another for the next start; a call without it or with another is refused."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

from tokenrouter.serving.peer_auth import carries_secret, peer_parameters, secret_path, server_secret


# a stand-in for a stub: reads the secret, then starts a process of its own (an engine's worker, a tool a
# library runs), which inherits its environment; prints the secret and that process's pid
STUB = ("import subprocess; from pathlib import Path; from tokenrouter.serving.peer_auth import server_secret; "
        "secret = server_secret(folder=Path({!r})); print(secret); "
        "print(subprocess.Popen(['sleep', '30'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)")
# (the worker holds neither of the stub's output pipes: the stand-in server reads them to their end)
# a stand-in for tritonserver: starts a "stub" that prints the secret it reads, then stays up
SERVER = ("import subprocess, sys, time; print(subprocess.run([sys.executable, '-c', sys.argv[1]], "
          "capture_output=True, text=True, check=True).stdout, flush=True); time.sleep(60)")


def _server(folder: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SERVER, STUB.format(str(folder))], stdout=subprocess.PIPE, text=True)


def test_the_launcher_and_the_stubs_of_one_start_share_one_secret_in_a_private_file(tmp_path: Path) -> None:
    folder = tmp_path / "secrets"
    server = _server(folder)
    try:
        made = server_secret(server.pid, folder)  # the launcher, right after the start (or the stub first)
        assert server.stdout.readline().strip() == made and len(made) >= 40
        path = secret_path(server.pid, folder)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(folder.stat().st_mode) == 0o700
        worker = int(server.stdout.readline())  # started by the stub after it had the secret
        try:
            environ = Path(f"/proc/{worker}/environ").read_bytes()
            assert b"PATH=" in environ and made.encode() not in environ  # a live worker's, not a zombie's (empty)
        finally:
            os.kill(worker, signal.SIGKILL)
    finally:
        server.kill()
        server.wait()
    following = _server(folder)  # the next start: another secret; the dead one's file is gone
    try:
        assert server_secret(following.pid, folder) != made
        assert not path.exists()
    finally:
        following.kill()
        following.wait()


def test_a_call_without_the_secret_or_with_another_is_refused() -> None:
    secret = "s" * 43
    assert carries_secret(peer_parameters(secret), secret)
    assert not carries_secret({}, secret)  # absent
    assert not carries_secret(peer_parameters(""), secret)
    assert not carries_secret(peer_parameters(secret[:-1]), secret)
    assert not carries_secret({"tokenrouter_peer_secret": 12345}, secret)
