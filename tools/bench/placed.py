"""One model per Triton server, all on this machine: a deployment over several servers (placement.py)
started on loopback, for benchmarks and tests. Each model gets its own server on free ports; a
node can be killed and started again on its ports, as a crash and a restart would do.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from pathlib import Path
from typing import Callable

from tokenrouter.config import TokenRouterConfig, load_config
from tokenrouter.launch.triton_install import TritonInstall
from tokenrouter.launch.triton_server import Ports, TritonServer
from tokenrouter.serving.pair_secret import PAIR_SECRET_ENV, PAIR_SECRET_FILE_ENV
from tokenrouter.serving.repository import render_repository


def free_ports(count: int) -> list[Ports]:
    """``count`` sets of three ports, none shared (free_ports.py never hands a port out twice)."""
    return [Ports.free() for _ in range(count)]


def on_loopback(config: TokenRouterConfig, ports: dict[str, Ports], delay_ms: float | None = None) -> TokenRouterConfig:
    """``config`` with every model on its own server at 127.0.0.1 (``ports[model].grpc``); ``delay_ms``
    sets the transport's injected delay."""
    raw = config.model_dump()
    for name, spec in raw["models"].items():
        spec["server"] = f"127.0.0.1:{ports[name].grpc}"
    if delay_ms is not None:
        raw["transport"]["delay_ms"] = delay_ms
    return load_config(raw)


def share_a_pair_secret() -> None:
    """Give the servers started from this process a secret if it has none: each server's start moves it into
    a private file of its own and names that file in tritonserver's environment (TritonServer.start)."""
    if not os.environ.get(PAIR_SECRET_FILE_ENV) and not os.environ.get(PAIR_SECRET_ENV):
        os.environ[PAIR_SECRET_ENV] = secrets.token_urlsafe(32)


class LoopbackNodes:
    """A server per model of ``config`` (placed by ``on_loopback``); ``servers[model]`` while it runs."""

    def __init__(self, config: TokenRouterConfig, ports: dict[str, Ports], folder: Path, install: TritonInstall,
                 backend_dir: Path, log_sink: Callable[[str], None] | None = None) -> None:
        self.config, self.ports, self.folder = config, ports, Path(folder)
        self.install, self.backend_dir, self.log_sink = install, backend_dir, log_sink
        self.servers: dict[str, TritonServer] = {}
        share_a_pair_secret()

    @property
    def entry(self) -> TritonServer:
        return self.servers[self.config.entry]

    def start_all(self, timeout_s: float = 600) -> "LoopbackNodes":
        try:
            for name in self.config.model_names:
                self.start(name, timeout_s=timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def start(self, name: str, config: TokenRouterConfig | None = None, timeout_s: float = 600) -> TritonServer:
        """The node of model ``name`` (from ``config``, default this deployment's), ready."""
        repository = render_repository(config or self.config, self.folder / f"{name}-{time.monotonic_ns()}",
                                       only=[name])
        server = TritonServer(repository, self.backend_dir, self.install, self.ports[name], host="127.0.0.1",
                              log_sink=self.log_sink, exit_timeout_s=5)
        self.servers[name] = server.start_ready(timeout_s)
        return self.servers[name]

    def kill(self, name: str) -> float:
        """SIGKILL the node's server and its stubs, as a crash would; returns when (monotonic)."""
        server = self.servers.pop(name)
        os.killpg(server.running.pid, signal.SIGKILL)
        killed = time.monotonic()
        server.stop()  # reaps it and removes its shared memory
        return killed

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()
        self.servers.clear()
