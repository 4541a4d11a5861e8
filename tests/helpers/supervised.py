"""A `tokenrouter serve` shared by the tests that break its server and watch the supervisor heal it
(tests/reliability/conftest.py: ``supervised_launcher``).

Its repository is the tiny one with `llm` served through a wrapper of the real backend whose loop raises
once a trigger file exists (test_loop_death.py): the injected bug comes from outside the product, the
way a user extends a repository; without the file the wrapper is the backend itself."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import Popen

from helpers.launcher import seconds_until_not_ready, tiny_repository
from tokenrouter.launch.triton_server import Ports

BREAKABLE_MODEL = "llm"
BREAKING_MODEL_PY = '''
import os

from tokenrouter.serving.subserver.backend_model import TritonPythonModel as Backend


class TritonPythonModel(Backend):
    def initialize(self, args):
        super().initialize(args)
        subserver = self.model.subserver
        execute = subserver._execute

        def broken(batch):
            if os.path.exists({trigger!r}):
                raise RuntimeError("a bug injected by the test")
            return execute(batch)

        subserver._execute = broken
'''
READY_AGAIN_S = 240.0  # a fresh start of the tiny pair takes 20-60 s on a shared 2-core machine


@dataclass
class Supervised:
    """The shared launcher, its ports, every line it printed so far, and its repository."""

    launcher: Popen
    ports: Ports
    repository: Path
    break_trigger: Path  # BREAKABLE_MODEL's loop raises while this file exists
    log: list[str] = field(default_factory=list)

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports.grpc}"

    @property
    def health_urls(self) -> list[str]:
        """Triton's readiness and the OpenAI server's health."""
        return [f"http://127.0.0.1:{self.ports.http}/v2/health/ready",
                f"http://127.0.0.1:{self.launcher.openai_port}/health"]

    def lines_since(self, start: int) -> list[str]:
        return self.log[start:]

    def wait_ready(self, timeout_s: float = READY_AGAIN_S) -> None:
        """Until both health URLs answer ready for 0.3 s on end: an earlier test's restart may be under way."""
        deadline = time.monotonic() + timeout_s
        while any(seconds_until_not_ready(url, time.monotonic(), time.monotonic() + 0.3) is not None
                  for url in self.health_urls):
            assert self.launcher.poll() is None, "the launcher exited:\n" + "".join(self.log[-30:])
            assert time.monotonic() < deadline, "not ready again:\n" + "".join(self.log[-30:])
            time.sleep(0.5)

    def wait_for_line(self, text: str, start: int, timeout_s: float) -> None:
        """Until a line printed after ``start`` holds ``text``."""
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.lines_since(start)):
            assert time.monotonic() < deadline, f"no {text!r}:\n" + "".join(self.log[-40:])
            time.sleep(0.1)


def breakable_repository(repository: Path, trigger: Path) -> Path:
    tiny_repository(repository)
    config = repository / BREAKABLE_MODEL / "config.pbtxt"
    config.write_text(config.read_text().replace('backend: "python_router"', 'backend: "python"'))
    (repository / BREAKABLE_MODEL / "1" / "model.py").write_text(BREAKING_MODEL_PY.format(trigger=str(trigger)))
    return repository
