"""The OpenAI-compatible server as a child process of the launcher (tokenrouter.openai_server).

Its own process (its event loop and JSON work never take the launcher's or a stub's CPU time
slice), its own process group (Ctrl-C reaches the launcher, which drains it), dying with the
launcher. The API key travels in a file only this user can read, named on the command line; never
the key itself on a command line (every local user can read those) or in its environment.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..openai_server.app import API_KEY_ENV, API_KEY_FILE_ENV
from ..serving.peer_auth import private_folder, write_private_file

from .errors import TritonError
from .processes import die_with_parent, started

DEFAULT_PORT = 9000


@dataclass
class OpenAIServer:
    repository: Path
    triton_url: str  # Triton's gRPC address
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    api_key: str | None = field(default=None, repr=False)
    drain_timeout_s: float = 30.0
    log_sink: Callable[[str], None] | None = None
    process: subprocess.Popen[str] | None = field(default=None, init=False)
    _key_file: Path | None = field(default=None, init=False, repr=False)
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=40), init=False)

    @property
    def running(self) -> subprocess.Popen[str]:
        """The process of this start (start() first)."""
        return started(self.process, "the OpenAI server")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        key_file = [f"--api-key-file={self._key_file}"] if self._key_file is not None else []
        return [sys.executable, "-m", "tokenrouter.openai_server", f"--model-repository={self.repository}",
                f"--triton-url={self.triton_url}", f"--host={self.host}", f"--port={self.port}",
                f"--drain-timeout={self.drain_timeout_s:g}", *key_file]

    def start(self) -> "OpenAIServer":
        env = {key: value for key, value in os.environ.items() if key not in (API_KEY_ENV, API_KEY_FILE_ENV)}
        if self.api_key:  # one file per launcher and port, removed at stop
            self._key_file = write_private_file(private_folder() / f"openai-api-key-{os.getpid()}-{self.port}",
                                                self.api_key)
        self.process = subprocess.Popen(self.command(), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True,
                                        preexec_fn=die_with_parent)
        threading.Thread(target=self._read_log, name="openai-server-log", daemon=True).start()
        return self

    def _read_log(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self.tail.append(line.rstrip("\n"))
            if self.log_sink is not None:
                self.log_sink(line.rstrip("\n"))

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as reply:
                return reply.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def wait_ready(self, timeout_s: float = 120.0) -> "OpenAIServer":
        """Until /health answers 200 (Triton and the fronts ready); raises with its log otherwise."""
        assert self.process is not None, "start() first"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise TritonError(f"the OpenAI server exited with code {self.process.returncode}; last log lines:\n"
                                  + "\n".join(self.tail))
            if self.is_ready():
                return self
            time.sleep(0.25)
        self.stop(grace_s=0.0)
        raise TritonError(f"the OpenAI server was not ready after {timeout_s:.0f} s; last log lines:\n"
                          + "\n".join(self.tail))

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal_stop(self) -> None:
        """SIGTERM: stop taking connections, let those in flight finish (up to the drain timeout)."""
        if self.alive():
            self.running.send_signal(signal.SIGTERM)

    def stop(self, grace_s: float | None = None) -> int | None:
        """SIGTERM, then SIGKILL after ``grace_s`` (default: the drain timeout and 5 s)."""
        if self.process is None:
            return None
        self.signal_stop()
        try:
            self.process.wait(timeout=self.drain_timeout_s + 5 if grace_s is None else grace_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self._key_file is not None:
            self._key_file.unlink(missing_ok=True)
        return self.process.returncode
