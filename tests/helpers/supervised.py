"""`tokenrouter serve` run by the tests of its supervisor (test_supervisor.py) and shared by the tests that
break its server and watch the supervisor heal it (tests/reliability/conftest.py: ``supervised_launcher``).

Its repository is the tiny one with `llm` served through a wrapper of the real backend whose loop raises
once a trigger file exists (test_loop_death.py): the injected bug comes from outside the product, the
way a user extends a repository; without the file the wrapper is the backend itself."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from helpers.launcher import launch, seconds_until_not_ready, tiny_repository, triton_pid
from tokenrouter.client import http_generate
from tokenrouter.launch.processes import stub_pids

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
PROMPT = "def greet(name):\n    return name\n"


class Launcher:
    """A running `tokenrouter serve` on ``repository`` and every line it printed so far."""

    def __init__(self, repository: Path, *args: str) -> None:
        self.repository = repository
        self.process, self.ports = launch("--model-repository", str(repository), *args)
        self.http_url, self.grpc_url = f"127.0.0.1:{self.ports.http}", f"127.0.0.1:{self.ports.grpc}"
        self.lines: list[str] = []  # kept read: a full pipe would block the launcher
        threading.Thread(target=lambda: self.lines.extend(self.process.stdout), daemon=True).start()

    def count(self, text: str) -> int:
        return sum(text in line for line in list(self.lines))

    def server_pid(self) -> int:
        """The tritonserver that runs now."""
        return triton_pid(self.process.pid)

    def stubs(self) -> dict[str, int]:
        """model -> stub pid of the tritonserver that runs now."""
        return stub_pids(self.server_pid())

    def wait_for(self, text: str, times: int, timeout_s: float = READY_AGAIN_S) -> None:
        """Until ``text`` has been printed ``times`` times in all."""
        deadline = time.monotonic() + timeout_s
        while self.count(text) < times:
            assert self.process.poll() is None, "the launcher exited:\n" + "".join(self.lines[-30:])
            assert time.monotonic() < deadline, f"no {text!r} #{times}:\n" + "".join(self.lines[-30:])
            time.sleep(0.1)

    def serves(self) -> None:
        reply = http_generate(self.http_url, {"text_input": PROMPT, "max_tokens": 4})
        assert (len(reply["output_ids"]), reply["finish_reason"]) == (4, "length"), reply


class Supervised(Launcher):
    """The launcher the reliability tests share: on ``breakable_repository``, whose BREAKABLE_MODEL's loop
    raises while ``break_trigger`` exists."""

    def __init__(self, repository: Path, break_trigger: Path, *args: str) -> None:
        super().__init__(breakable_repository(repository, break_trigger), *args)
        self.break_trigger = break_trigger

    @property
    def health_urls(self) -> list[str]:
        """Triton's readiness and the OpenAI server's health."""
        return [f"http://{self.http_url}/v2/health/ready", f"http://127.0.0.1:{self.process.openai_port}/health"]

    def wait_ready(self, timeout_s: float = READY_AGAIN_S) -> None:
        """Until both health URLs answer ready for 0.3 s on end: an earlier test's restart may be under way."""
        deadline = time.monotonic() + timeout_s
        while any(seconds_until_not_ready(url, time.monotonic(), time.monotonic() + 0.3) is not None
                  for url in self.health_urls):
            assert self.process.poll() is None, "the launcher exited:\n" + "".join(self.lines[-30:])
            assert time.monotonic() < deadline, "not ready again:\n" + "".join(self.lines[-30:])
            time.sleep(0.5)


def breakable_repository(repository: Path, trigger: Path) -> Path:
    tiny_repository(repository)
    config = repository / BREAKABLE_MODEL / "config.pbtxt"
    config.write_text(config.read_text().replace('backend: "python_router"', 'backend: "python"'))
    (repository / BREAKABLE_MODEL / "1" / "model.py").write_text(BREAKING_MODEL_PY.format(trigger=str(trigger)))
    return repository
