"""One tritonserver child process: its command line and ports, its start (retried when it aborts), its
log, its readiness and its stop; shared by `tokenrouter serve` and the tests. The installation it runs
comes from triton_install.py, the calls to its models from server_control.py.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TextIO

from tokenrouter.serving.pair_secret import move_secret_to_file
from tokenrouter.serving.peer_auth import private_folder, secret_path, server_secret

from .errors import StartAborted, TritonError
from .free_ports import free_port_run
from .processes import die_with_parent, started, stub_pids
from .server_control import ServerControl
from .shared_memory import make_private, remove_stale_shm_regions, shm_regions_of
from .start_watch import StallWatch
from .triton_install import TritonInstall, server_env

# No client may load a model (with files: code that would run in the server), unload one or reload it:
# model control "none" refuses every such call (Triton 2.51: "explicit model load / unload is not
# allowed"), with no key to steal. A restricted API would need a key on tritonserver's command line,
# which /proc/<pid>/cmdline shows to every local user. A config edit applies by a restart that the
# launcher drains (SIGHUP: serve.py).
MODEL_CONTROL = "--model-control-mode=none"
# Triton keeps up to 8 gRPC request objects for reuse by default, and with them the memory of the largest
# inputs they held; without the pool a request costs one allocation more. See triton_install.MMAP_THRESHOLD_ENV too.
NO_REQUEST_POOL = "--grpc-infer-allocation-pool-size=0"

START_ATTEMPTS = 3  # a start that aborts is tried again this many times in all
_LOADED = re.compile(r"successfully loaded '([^']+)'")


@dataclass
class StartTimes:
    """How long a start's phases took, from tritonserver's log as it comes: its own start up to the
    first model's load, the models' loading (the Python stubs: interpreter, imports, weights), and the
    rest until the server answered ready."""

    started: float = field(default_factory=lambda: time.monotonic())
    first_loading: float | None = None
    loaded: dict[str, float] = field(default_factory=dict)  # model -> when Triton said it had loaded
    ready: float | None = None

    def see(self, line: str) -> None:
        if self.first_loading is None and '"loading: ' in line:
            self.first_loading = time.monotonic()
        if match := _LOADED.search(line):
            self.loaded[match.group(1)] = time.monotonic()

    def summary(self) -> str:
        loading = self.first_loading or self.started
        last = max(self.loaded.values(), default=loading)
        ready = self.ready or last
        slowest = f" (the last, {max(self.loaded, key=self.loaded.__getitem__)})" if self.loaded else ""
        return (f"{ready - self.started:.1f} s: tritonserver {loading - self.started:.1f} s, loading the models "
                f"{last - loading:.1f} s{slowest}, ready {ready - last:.1f} s later")


@dataclass(frozen=True)
class Ports:
    http: int = 8000
    grpc: int = 8001
    metrics: int = 8002

    @classmethod
    def free(cls, host: str = "127.0.0.1") -> "Ports":
        """Three adjacent ports free right now (tests, benchmarks: free_ports.py)."""
        first = free_port_run(3, host)
        return cls(first, first + 1, first + 2)


@dataclass
class TritonServer:
    """One tritonserver child process in its own process group (so no stub outlives it)."""

    repository: Path
    backend_dir: Path
    install: TritonInstall
    ports: Ports = field(default_factory=Ports)
    host: str | None = None  # bind address for all three endpoints; None: Triton's default (all)
    log_sink: Callable[[str], None] | None = None  # receives each server log line
    extra_args: tuple[str, ...] = ()
    exit_timeout_s: int = 10
    # a start whose processes stay idle this long while not ready is taken as hung and made again
    # (start_watch.py); a load that waits on slow storage that long without CPU needs more
    start_stall_s: float = 60.0
    process: subprocess.Popen[str] | None = field(default=None, init=False)
    peer_secret: str = field(default="", init=False, repr=False)
    _secret_file: Path | None = field(default=None, init=False, repr=False)
    _pair_file: Path | None = field(default=None, init=False, repr=False)  # the pair secret, moved from the env
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=60), init=False)
    # model -> stub pid, read the moment the server turned ready: what a supervisor must watch (read
    # later, a stub that died in between would be missing from the list and never noticed)
    ready_stubs: dict[str, int] = field(default_factory=dict, init=False)
    # its shared-memory regions, read then too: once tritonserver is killed its stubs exit, and
    # nothing maps them any more when stop() looks (Triton removes them on a clean exit only)
    ready_regions: set[Path] = field(default_factory=set, init=False)
    start_times: StartTimes = field(default_factory=StartTimes, init=False)
    _reader: threading.Thread | None = field(default=None, init=False)

    def command(self) -> list[str]:
        args = [
            str(self.install.binary),
            f"--model-repository={self.repository}",
            f"--backend-directory={self.backend_dir}",
            f"--http-port={self.ports.http}",
            f"--grpc-port={self.ports.grpc}",
            f"--metrics-port={self.ports.metrics}",
            MODEL_CONTROL,  # every model loads at start; nothing loads or unloads later
            NO_REQUEST_POOL,
            f"--exit-timeout-secs={self.exit_timeout_s}",
        ]
        if self.host is not None:
            args += [f"--http-address={self.host}", f"--grpc-address={self.host}", f"--metrics-address={self.host}"]
        return args + list(self.extra_args)

    @property
    def http_url(self) -> str:
        return f"{self.host or '127.0.0.1'}:{self.ports.http}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host or '127.0.0.1'}:{self.ports.grpc}"

    @property
    def running(self) -> subprocess.Popen[str]:
        """The process of this start (start() first)."""
        return started(self.process, "tritonserver")

    @property
    def control(self) -> ServerControl:
        """Calls to this start's models: the drain, the ending of requests in flight."""
        return ServerControl(self.grpc_url, f"{self.host or '127.0.0.1'}:{self.ports.metrics}", self.peer_secret)

    def start(self) -> "TritonServer":
        if self.process is not None:
            raise TritonError("server already started")
        remove_stale_shm_regions()
        self.start_times = StartTimes()
        env = dict(os.environ)
        pair_file = private_folder() / f"pair-secret-{os.getpid()}-{id(self)}"
        self._pair_file = pair_file if move_secret_to_file(env, pair_file) else None
        env = server_env(self.install, env)
        self.process = subprocess.Popen(
            self.command(),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,  # own process group: signals from the terminal reach us, not it
            preexec_fn=die_with_parent,
        )
        self._reader = threading.Thread(target=self._read_log, name="tritonserver-log", daemon=True)
        self._reader.start()
        # the subservers' peer messages and the launcher's control calls carry it; one per start, in a
        # private file named after this process (not in its environment: peer_auth.py)
        self._secret_file = secret_path(self.process.pid)
        self.peer_secret = server_secret(self.process.pid)
        return self

    def _read_log(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            line = line.rstrip("\n")
            self.start_times.see(line)
            self.tail.append(line)
            if self.log_sink is not None:
                self.log_sink(line)

    def log_tail(self) -> str:
        return "\n".join(self.tail)

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=2) as reply:
                return reply.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def wait_ready(self, timeout_s: float = 300.0) -> "TritonServer":
        """Block until the server and all its models are ready; raise with the log tail otherwise."""
        assert self.process is not None, "start() first"
        deadline = time.monotonic() + timeout_s
        watch = StallWatch(self.process.pid, self.start_stall_s)  # its own group: start_new_session
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self._join_reader()
                error = StartAborted if self.process.returncode < 0 else TritonError
                raise error(
                    f"tritonserver exited with code {self.process.returncode} before it was ready; "
                    f"last log lines:\n{self.log_tail()}"
                )
            if self.is_ready():
                self.start_times.ready = time.monotonic()
                self.ready_stubs, self.ready_regions = self.stubs(), self._shm_regions()
                make_private(self.ready_regions)
                return self
            if (stalled := watch.stalled()) is not None:
                raise StartAborted(f"{stalled}; last log lines:\n{self.log_tail()}")
            time.sleep(0.25)
        raise TritonError(f"tritonserver not ready after {timeout_s:.0f} s; last log lines:\n{self.log_tail()}")

    def start_ready(self, timeout_s: float = 300.0, say: Callable[[str], None] = lambda line: None) -> "TritonServer":
        """Start and wait until ready; a start that aborts (``StartAborted``) is made again with a
        fresh process, up to START_ATTEMPTS in all. Returns the server that is ready. A start that
        fails (or is interrupted) is stopped before the error is raised: none of its processes
        (a stub holds ~0.5 GB) or shared memory is left."""
        server = self
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                return server.start().wait_ready(timeout_s)
            except StartAborted as aborted:
                server.stop()  # its stubs and shared memory
                if attempt == START_ATTEMPTS:
                    raise
                say(f"{str(aborted).splitlines()[0]}; starting it again ({attempt + 1} of {START_ATTEMPTS})")
                server = dataclasses.replace(server)
            except BaseException:
                server.stop()
                raise
        raise AssertionError("unreachable")

    def stubs(self) -> dict[str, int]:
        """Model name -> pid of its Python-backend stub."""
        return stub_pids(self.running.pid)

    def turn_not_ready(self) -> None:
        """From now on Triton answers not ready and begins its shutdown (SIGTERM), while the responses
        already sent (the errors of requests just ended) still reach their clients; stop() follows.
        Without model control nothing else makes Triton 2.51 say not ready when a stub died."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def stop(self, grace_s: float | None = None) -> int | None:
        """SIGTERM (Triton drains in-flight requests), then SIGKILL whatever is left of the group
        and remove the shared-memory regions that it mapped (a killed server leaves them)."""
        if self.process is None:
            return None
        grace_s = self.exit_timeout_s + 5 if grace_s is None else grace_s
        own_regions = self._shm_regions() | self.ready_regions
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        try:  # stubs left behind by a killed server share its process group
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for region in own_regions:  # Triton removes them on a clean exit, not when killed
            region.unlink(missing_ok=True)
        for secret_file in (self._secret_file, self._pair_file):
            if secret_file is not None:
                secret_file.unlink(missing_ok=True)
        self._join_reader()
        return self.process.returncode

    def _shm_regions(self) -> set[Path]:
        """The regions of this server and its stubs (only theirs: other servers on the machine
        may be starting and must keep theirs)."""
        return shm_regions_of([self.running.pid, *stub_pids(self.running.pid).values()])

    def _join_reader(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=5)

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def write_lines(stream: TextIO) -> Callable[[str], None]:
    """A log sink that forwards server lines to ``stream`` as they come."""

    def sink(line: str) -> None:
        stream.write(line + "\n")
        stream.flush()

    return sink
