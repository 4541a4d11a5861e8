"""Start, wait for and stop one tritonserver process; shared by `tokenrouter serve` and the tests.

A system `tritonserver` (the NGC image) is used when there is one; otherwise the binary that the
`nvidia-pytriton` wheel bundles. Either way the server gets a backend directory of its own, so
that `backend: "python_router"` resolves to backends/python_router/model.py, and an environment
in which the Python backend's stub imports this interpreter's packages.
"""

from __future__ import annotations

import collections
import ctypes
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.error
import urllib.request
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TextIO

from tokenrouter.procfs import proc_stat
from tokenrouter.openai_server.app import API_KEY_ENV
from tokenrouter.serving.pair_secret import PAIR_SECRET_ENV, move_secret_to_file
from tokenrouter.serving.control import ControlCall
from tokenrouter.serving.peer_auth import peer_parameters, private_folder, secret_path, server_secret
from tokenrouter.serving.schema import CONTROL_INPUT

from .paths import backend_model_file

BACKEND_MODEL_FILE = backend_model_file()
SYSTEM_TRITON_HOME = Path("/opt/tritonserver")


class TritonError(RuntimeError):
    """The server could not be found, started or made ready; the message says why."""


class StartAborted(TritonError):
    """tritonserver was killed by a signal before it was ready (not a bad repository: that exits
    with a code). Seen with the bundled 2.51 on a busy machine: an uncaught
    ``boost::interprocess::lock_exception`` in its Python backend aborts the start (SIGABRT)."""


# No client may load a model (with files: code that would run in the server), unload one or reload it:
# model control "none" refuses every such call (Triton 2.51: "explicit model load / unload is not
# allowed"), with no key to steal. A restricted API would need a key on tritonserver's command line,
# which /proc/<pid>/cmdline shows to every local user. A config edit applies by a restart that the
# launcher drains (SIGHUP: serve.py).
MODEL_CONTROL = "--model-control-mode=none"

START_ATTEMPTS = 3  # a start that aborts is tried again this many times in all
# The entry subserver's gauges of the requests it holds, and how long they must read 0 for a drain
# to be over (the metrics refresh every 0.5 s)
HELD_GAUGES = ("tokenrouter_active_requests", "tokenrouter_queue_depth")
IDLE_S = 1.0
CALL_TIMEOUT_S = 5.0  # one control call or metrics read; one that takes longer says nothing
DRAIN_POLL_S = 0.2


def check_numpy_for_wheel_stub() -> None:
    """The nvidia-pytriton wheel's stub (Triton 2.51) was built with a pybind11 that reads numpy 1's
    dtype layout: under numpy 2 every tensor it hands to Python is garbled (a BYTES input "hello"
    arrives as copies of its first byte) and the stub aborts. tools/install.sh pins numpy 1.26."""
    import numpy

    if int(numpy.__version__.split(".")[0]) >= 2:
        raise TritonError(f"the bundled tritonserver's Python stub needs numpy 1.x, found {numpy.__version__}: "
                          "run tools/install.sh, or `pip install --no-deps numpy==1.26.4`")


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
class TritonInstall:
    """Where one Triton installation keeps what a launch needs."""

    binary: Path
    backends: Path  # folder of backends (python/, and on the NGC image tensorrtllm/ etc.)
    lib_dirs: tuple[Path, ...] = ()  # extra LD_LIBRARY_PATH entries (the wheel's bundled libs)
    stub: Path | None = None  # Python backend stub to add to backends/python (the wheel only)


def find_triton() -> TritonInstall:
    """A system tritonserver when present, else the nvidia-pytriton wheel's bundled one."""
    system = shutil.which("tritonserver") or (
        str(SYSTEM_TRITON_HOME / "bin" / "tritonserver")
        if (SYSTEM_TRITON_HOME / "bin" / "tritonserver").is_file()
        else None
    )
    if system:
        home = Path(system).resolve().parents[1]
        return TritonInstall(binary=Path(system), backends=home / "backends")
    # The wheel nvidia-pytriton: only its files are used, not its API, and it is installed without
    # its dependencies (tools/install.sh), so locate the package without importing it.
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise TritonError(
            "no tritonserver found: install Triton (the NGC image has it) or "
            "`pip install --no-deps nvidia-pytriton==0.7.0`"
        )
    package = Path(list(spec.submodule_search_locations)[0]).resolve()
    home = package / "tritonserver"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = home / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise TritonError(f"the nvidia-pytriton wheel has no Python backend stub for Python {version}")
    libs = package.parent / "nvidia_pytriton.libs"
    return TritonInstall(binary=home / "bin" / "tritonserver", backends=home / "backends", lib_dirs=(libs,), stub=stub)


def build_backend_dir(install: TritonInstall, dest: Path, model_file: Path | None = BACKEND_MODEL_FILE) -> Path:
    """Make ``dest`` a backend directory: the installation's backends plus python_router.

    The stub is copied (not linked) because the Python backend looks for it next to
    libtriton_python.so in the folder Triton loaded the library from.
    """
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for backend in sorted(install.backends.iterdir()):
        if backend.name == "python_router" or not backend.is_dir():
            continue
        if backend.name == "python" and install.stub is not None:
            shutil.copytree(backend, dest / "python", ignore=shutil.ignore_patterns("__pycache__"))
            shutil.copy2(install.stub, dest / "python" / install.stub.name)
        else:
            (dest / backend.name).symlink_to(backend.resolve(), target_is_directory=True)
    if model_file is not None:
        if not model_file.is_file():
            raise TritonError(f"the python_router backend is missing: {model_file} does not exist")
        (dest / "python_router").mkdir()
        (dest / "python_router" / "model.py").symlink_to(model_file.resolve())
    return dest


# Secrets that the launcher's environment may hold and tritonserver's must not: the OpenAI API key (the
# OpenAI server's alone) and the pair secret (moved into a file first: TritonServer.start)
SECRET_ENVS = (API_KEY_ENV, PAIR_SECRET_ENV)


def server_env(install: TritonInstall, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for tritonserver and its stubs.

    The stub links libpython and finds its prefix by looking up `python3` on PATH; with this
    interpreter's bin first, a virtual environment's pyvenv.cfg is honoured, so the stub sees
    the same site-packages (including .pth files of editable installs) as this process.
    """
    if install.stub is not None:
        check_numpy_for_wheel_stub()
    env = dict(os.environ if base is None else base)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    lib_dirs = [str(d) for d in install.lib_dirs]
    if install.stub is not None and sysconfig.get_config_var("Py_ENABLE_SHARED"):
        # the wheel's stub links libpython3.X from the loader path; this interpreter's own libpython
        # must win over the system's, or extension modules of this stdlib (e.g. _ssl) fail to load.
        # Not with a system Triton (the NGC image): its stub is built for the image's Python, and the
        # system library dir first would load the host driver's libcuda before NVIDIA's CUDA
        # forward-compatibility libraries that the image's entrypoint put on LD_LIBRARY_PATH.
        lib_dirs.insert(0, sysconfig.get_config_var("LIBDIR"))
    if lib_dirs:
        env["LD_LIBRARY_PATH"] = os.pathsep.join([*lib_dirs, *filter(None, [env.get("LD_LIBRARY_PATH")])])
    env.pop("PYTHONHOME", None)  # would point the embedded interpreter at another installation
    for name in SECRET_ENVS:  # whatever a stub starts inherits them; /proc/<pid>/environ shows them
        env.pop(name, None)
    return env


@dataclass(frozen=True)
class Ports:
    http: int = 8000
    grpc: int = 8001
    metrics: int = 8002

    @classmethod
    def free(cls, host: str = "127.0.0.1") -> "Ports":
        """Three ports the kernel reports free right now (tests; a race is unlikely, not impossible)."""
        socks = [socket.socket() for _ in range(3)]
        try:
            for sock in socks:
                sock.bind((host, 0))
            return cls(*(sock.getsockname()[1] for sock in socks))
        finally:
            for sock in socks:
                sock.close()


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
            preexec_fn=_die_with_parent,
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
        return stub_pids(self.process.pid)

    def drain(self, fronts: list[str], timeout_s: float, entry: str | None = None,
              reason: str = "the server is shutting down; try again") -> bool:
        """Refuse new requests at the ``fronts`` and wait up to ``timeout_s`` for those in flight.

        Triton's own SIGTERM drain does not hold for requests that make new internal requests (a
        front's call to the entry subserver, each handoff is a BLS call): those are refused as soon
        as the server stops. Unloading the fronts does not hold either: Triton 2.51 keeps a model
        for every client gRPC stream whose first request went to it, until the client closes the
        stream (stream_infer_handler.cc), so such an unload never finishes. So each front is told
        to drain (an authenticated control call): it refuses new requests with ``reason`` and
        answers whether any is still in flight. Done when every front answered none and the
        ``entry`` subserver (which clients may call directly) held no request on two reads of its
        metrics IDLE_S apart. A call that fails or stalls says nothing: the drain goes on until its
        deadline, never ends early. Returns True when all drained in time."""
        deadline = time.monotonic() + timeout_s
        idle_since = None
        while True:
            fronts_idle = all([self._control(front, "drain", reason) for front in fronts])  # each one is told
            if fronts_idle and (entry is None or self.requests_held(entry) == 0):
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since >= IDLE_S or entry is None:
                    return True
            else:
                idle_since = None
            if time.monotonic() >= deadline:
                return False
            time.sleep(DRAIN_POLL_S)

    def requests_held(self, subserver: str) -> float | None:
        """Requests that ``subserver`` holds, active or waiting for admission, from its metrics
        (refreshed twice a second); None when they cannot be read."""
        try:
            with urllib.request.urlopen(f"http://{self.host or '127.0.0.1'}:{self.ports.metrics}/metrics",
                                        timeout=CALL_TIMEOUT_S) as reply:
                page = reply.read().decode()
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return None
        wanted = {f'{family}{{model="{subserver}"}}' for family in HELD_GAUGES}
        values = [float(line.rsplit(" ", 1)[1]) for line in page.splitlines() if line.split(" ", 1)[0] in wanted]
        return sum(values) if len(values) == len(wanted) else None

    def end_in_flight(self, model: str, reason: str) -> bool:
        """Tell ``model`` to end every request in flight with an error saying ``reason``: the entry
        subserver (``subserver``) or a front. Returns whether it was taken."""
        return self._control(model, "shutdown", reason)

    def _control(self, model: str, command: str, reason: str) -> bool:
        """An authenticated control call (serving/control.py) to ``model``, a front or the entry subserver,
        on the ``control`` input they all declare. Whether it answered without an error within CALL_TIMEOUT_S."""
        import queue

        import tritonclient.grpc as grpcclient

        payload = grpcclient.InferInput(CONTROL_INPUT, [1, 1], "BYTES")
        payload.set_data_from_numpy(ControlCall(command, reason).row())
        answers: queue.Queue = queue.Queue()
        client = None
        try:
            client = grpcclient.InferenceServerClient(self.grpc_url)
            client.start_stream(callback=lambda result, error: answers.put(error))
            client.async_stream_infer(model, [payload], enable_empty_final_response=True,
                                      parameters=peer_parameters(self.peer_secret))
            return answers.get(timeout=CALL_TIMEOUT_S) is None
        except Exception:  # noqa: BLE001 - the server may be gone or stalled; the caller goes on
            return False
        finally:
            if client is not None:  # cancelled, not closed: a stalled server would hold a close forever
                client.stop_stream(cancel_requests=True)
                client.close()

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
        return shm_regions_of([self.process.pid, *stub_pids(self.process.pid).values()])

    def _join_reader(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=5)

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


SHM_DIR = Path("/dev/shm")
# The Python backend's regions, and those of python_router models (a Python-based backend names its
# regions after itself: triton_python_router_backend_shm_region_*, which leaked on every stop)
SHM_PATTERN = "triton_python*_backend_shm_region_*"


def _age_s(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except FileNotFoundError:  # removed meanwhile by its server
        return 0.0


def make_private(paths: set[Path]) -> None:
    """Mode 0600 for these files of this user: the Python backend creates its shared-memory regions 0644,
    so every local account could read the tensors and parameters in them. The processes that map them
    keep their mappings, and the backend reopens a growing region as this same user."""
    for path in paths:
        try:
            path.chmod(0o600)
        except OSError:  # gone with a stub that just died: the supervisor deals with that
            pass


def remove_stale_shm_regions(min_age_s: float = 60.0) -> list[Path]:
    """Remove the Python backend's shared-memory regions that no live process maps.

    A server killed before it could clean up leaves them (hundreds of MB each, in RAM). A region
    still mapped belongs to a live server, possibly another user's launch on this machine, and
    stays; ``min_age_s`` spares one that a starting server has created but not mapped yet."""
    regions = {path for path in SHM_DIR.glob(SHM_PATTERN) if _age_s(path) >= min_age_s}
    if not regions:
        return []
    mapped = _mapped_files()
    removed = []
    for region in sorted(regions - mapped):
        try:
            region.unlink()
            removed.append(region)
        except OSError:
            pass
    return removed


def stub_pids(server_pid: int) -> dict[str, int]:
    """Model name -> pid of its Python-backend stub, among the children of tritonserver ``server_pid``."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        stat = proc_stat(proc.name)
        if stat is None or stat.ppid != server_pid:
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) > 1 and argv[0].endswith(b"triton_python_backend_stub"):
            found[Path(argv[1].decode()).parts[-3]] = int(proc.name)  # <repo>/<model>/<version>/model.py
    return found


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    stat = proc_stat(pid)
    return stat is not None and stat.state not in ("Z", "X")


def shm_regions_of(pids: list[int]) -> set[Path]:
    """The Python-backend shared-memory regions that the processes ``pids`` map."""
    return {region for region in _mapped_files(pids) if region.match(SHM_PATTERN)}


def _mapped_files(pids: list[int] | None = None) -> set[Path]:
    """Files under SHM_DIR that the processes ``pids`` (None: all) map."""
    mapped: set[Path] = set()
    paths = Path("/proc").glob("[0-9]*/maps") if pids is None else [Path(f"/proc/{pid}/maps") for pid in pids]
    for maps in paths:
        try:
            text = maps.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            fields = line.split(maxsplit=5)  # address perms offset device inode [path]
            if len(fields) == 6 and fields[5].startswith(str(SHM_DIR)):
                mapped.add(Path(fields[5]))
    return mapped


# looked up here, not in the forked child, where taking the loader's lock could deadlock
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the launching thread dies, even by SIGKILL (Linux only)."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def write_lines(stream: TextIO) -> Callable[[str], None]:
    """A log sink that forwards server lines to ``stream`` as they come."""

    def sink(line: str) -> None:
        stream.write(line + "\n")
        stream.flush()

    return sink
