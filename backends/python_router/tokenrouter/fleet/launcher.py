"""``tokenrouter fleet``: NVIDIA Dynamo's frontend and N replicas of the pair (each a Dynamo worker).

    tokenrouter fleet --tiny --replicas 2 --migration-limit 2    # one machine, loopback only
    tokenrouter fleet --tiny --pools 2+2                          # the pair split: 2 entry + 2 peer workers

With ``--pools M+K`` the pair is split over workers: M entry_engine.py (the small model and the policy,
each registered as the served model: the frontend spreads requests over them) and K peer_worker.py of
the other model, reached by worker-to-worker calls; each request is pinned to one peer instance, which
answers the entry instance that sent it.

On one machine discovery goes through a folder and every socket is pinned to 127.0.0.1 (no etcd,
no NATS). Across hosts, ``--discovery etcd`` with ``ETCD_ENDPOINTS`` and ``NATS_SERVER`` set: one
host runs ``--no-workers``, the others ``--no-frontend`` (docs/deploy.md, "Fleet"). A worker that
dies is started again; SIGTERM/SIGINT drains: the workers first (each finishes what it holds,
Dynamo's own graceful stop), the frontend last, so no request in flight loses its endpoint.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..serving.pair_secret import PAIR_SECRET_FILE_ENV, move_secret_to_file
from ..serving.peer_auth import write_private_file

ROUTER_MODES = ("round-robin", "random", "power-of-two", "least-loaded", "kv")
WATCH_PERIOD_S = 0.5
MAX_STATUS_PORT = 32767
RESTART_BACKOFF_S = (0.0, 1.0, 2.0, 5.0, 15.0)  # a crash loop does not spin the CPU


def configure(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="the pair's YAML config (configs/)")
    source.add_argument("--tiny", action="store_true", help="the tiny random pair, ready in seconds")
    parser.add_argument("--replicas", type=int, default=1, help="workers on this machine, each a whole pair")
    parser.add_argument("--pools", metavar="M+K",
                        help="split the pair: M entry (small-model) workers and K peer (large-model) workers "
                             "instead of whole-pair replicas")
    parser.add_argument("--router-mode", choices=ROUTER_MODES, default="round-robin",
                        help="how the frontend picks a replica (default round-robin)")
    parser.add_argument("--migration-limit", type=int, default=2,
                        help="times a request may move to another replica when its own dies (default 2; 0: off)")
    parser.add_argument("--host", default="127.0.0.1", help="the frontend's address (default: this machine only)")
    parser.add_argument("--http-port", type=int, default=8000, help="the OpenAI API's port (default 8000)")
    parser.add_argument("--served-model-name", default="tokenrouter")
    parser.add_argument("--discovery", choices=("file", "etcd"), default="file",
                        help="file: one machine (a folder under --run-dir); etcd: across hosts "
                             "(ETCD_ENDPOINTS and NATS_SERVER in the environment)")
    parser.add_argument("--run-dir", help="discovery folder and logs (default: a new temporary folder)")
    parser.add_argument("--no-frontend", action="store_true", help="workers only (a worker host of a fleet)")
    parser.add_argument("--no-workers", action="store_true", help="the frontend only (the entry host of a fleet)")
    parser.add_argument("--gpus-per-replica", type=int, default=0, metavar="K",
                        help="worker i sees GPUs i*K .. i*K+K-1 (CUDA_VISIBLE_DEVICES); default 0: unchanged")
    parser.add_argument("--worker-status-port", type=int, default=-1, metavar="PORT",
                        help="worker i serves its /health and /metrics (KV blocks per model) on PORT + i "
                             "(default -1: off)")
    parser.add_argument("--drain-timeout", type=float, default=30.0,
                        help="seconds each process gets to finish its requests on SIGTERM (default 30)")


def fleet_environment(discovery: str, run_dir: Path) -> dict[str, str]:
    """Dynamo's settings for this machine's processes. ``file``: loopback only, no etcd or NATS."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HOME": str(run_dir / "home")}  # the frontend caches model files under $HOME/.cache/dynamo
    if discovery == "file":
        env.update(DYN_DISCOVERY_BACKEND="file", DYN_FILE_KV=str(run_dir / "kv"), DYN_REQUEST_PLANE="tcp",
                   DYN_EVENT_PLANE="zmq", DYN_TCP_RPC_HOST="127.0.0.1", DYN_TCP_RESPONSE_STREAM_HOST="127.0.0.1",
                   DYN_EVENT_PLANE_HOST="127.0.0.1", DYN_SYSTEM_HOST="127.0.0.1", DYN_SYSTEM_PORT="-1",
                   DYN_SELF_HOST_METADATA="0")
    else:
        missing = [name for name in ("ETCD_ENDPOINTS", "NATS_SERVER") if not os.environ.get(name)]
        if missing:
            raise SystemExit(f"tokenrouter fleet --discovery etcd: set {' and '.join(missing)}")
        env.update(DYN_DISCOVERY_BACKEND="etcd", DYN_REQUEST_PLANE="nats", DYN_EVENT_PLANE="nats")
    return env


def worker_environment(index: int, status_port: int, gpus_per_replica: int) -> dict[str, str]:
    """Worker ``index``'s own settings: its status port, its GPUs."""
    env = {} if status_port < 0 else {"DYN_SYSTEM_PORT": str(status_port + index)}
    if gpus_per_replica > 0:
        first = index * gpus_per_replica
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(first + k) for k in range(gpus_per_replica))
    return env


def frontend_command(args: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "dynamo.frontend", "--http-host", args.host, "--http-port", str(args.http_port),
            "--router-mode", args.router_mode, "--migration-limit", str(args.migration_limit),
            "--namespace", "tokenrouter"]


def worker_command(config: Path, served_model_name: str) -> list[str]:
    return [sys.executable, "-m", "tokenrouter.fleet.worker", "--config", str(config),
            "--served-model-name", served_model_name, "--namespace", "tokenrouter"]


def parse_pools(text: str) -> tuple[int, int]:
    """``M+K`` as (M, K)."""
    parts = text.split("+")
    if len(parts) != 2 or not all(part.strip().isdigit() for part in parts):
        raise SystemExit(f"--pools {text}: give M+K (entry workers + peer workers), e.g. 2+2")
    entries, peers = (int(part) for part in parts)
    if entries < 1 or peers < 1:
        raise SystemExit(f"--pools {text}: at least one entry worker and one peer worker")
    return entries, peers


def pool_workers(config: Path, served_model_name: str, run_dir: Path, status_port: int, entries: int,
                 peers: int) -> list["Process"]:
    """The split pair's workers: ``entries`` entry workers (each served to the frontend, each admitting
    against 1/``entries`` of a peer instance's KV), then ``peers`` of the other model."""
    from ..config import load_config

    models = load_config(config)
    if len(models.models) != 2:
        raise SystemExit(f"--pools: a pair split over pools has two models; {config} has {models.model_names}")
    entry = [sys.executable, "-m", "tokenrouter.fleet.entry_engine", "--config", str(config),
             "--served-model-name", served_model_name, "--namespace", "tokenrouter", "--entries", str(entries)]
    workers = [Process(f"entry worker {m}", entry, run_dir / f"entry-{m}.log",
                       env=worker_environment(m, status_port, 0)) for m in range(entries)]
    (model,) = [m for m in models.model_names if m != models.entry]
    command = [sys.executable, "-m", "tokenrouter.fleet.peer_worker", "--config", str(config), "--model", model,
               "--namespace", "tokenrouter"]
    for k in range(peers):
        workers.append(Process(f"peer worker {model} {k}", command, run_dir / f"peer-{model}-{k}.log",
                               env=worker_environment(len(workers), status_port, 0)))
    return workers


def provide_pair_secret(env: dict[str, str], run_dir: Path) -> None:
    """The split pair's workers sign their calls with the deployment's secret (pair_secret.py): the one
    given (moved from the environment into a private file), or a new one for this machine's run."""
    path = run_dir / "pair-secret"
    if move_secret_to_file(env, path) or env.get(PAIR_SECRET_FILE_ENV):
        return
    write_private_file(path, secrets.token_urlsafe(32))
    env[PAIR_SECRET_FILE_ENV] = str(path)


@dataclass
class Process:
    name: str
    command: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)  # this process's own settings
    popen: subprocess.Popen | None = None
    restarts: list[float] = field(default_factory=list)

    def start(self, env: dict[str, str]) -> None:
        with open(self.log, "ab") as out:
            self.popen = subprocess.Popen(self.command, env={**env, **self.env}, stdout=out, stderr=subprocess.STDOUT,
                                          start_new_session=True)  # a terminal's Ctrl-C reaches us only

    def _running(self) -> subprocess.Popen | None:
        """The process while it runs; None before it starts and after it ends."""
        return self.popen if self.popen is not None and self.popen.poll() is None else None

    @property
    def alive(self) -> bool:
        return self._running() is not None

    @property
    def returncode(self) -> int | None:
        """Its exit status once it ended (None while it runs, or before it starts)."""
        return None if self.popen is None else self.popen.returncode

    def terminate(self) -> None:
        """SIGTERM if it runs: Dynamo drains on it."""
        if (popen := self._running()) is not None:
            popen.send_signal(signal.SIGTERM)

    def stop(self, timeout: float) -> None:
        """SIGTERM (Dynamo drains), then SIGKILL after ``timeout``."""
        popen = self._running()
        if popen is None:
            return
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(timeout)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()


def resolve_config(args: argparse.Namespace, run_dir: Path) -> Path:
    """The config the workers load: ``--config``, or the tiny config with the tiny pair's folders."""
    return tiny_config(run_dir) if args.tiny else Path(args.config).resolve()


def tiny_config(folder: Path) -> Path:
    """``configs/tiny.yaml`` with the tiny pair's folders (built on first use), written into ``folder``."""
    from tokenrouter_engines.tiny import ensure_tiny_pair

    from ..launch.serve import TINY_CONFIG, TINY_FAMILY, TINY_SEED

    pair = ensure_tiny_pair(TINY_FAMILY, TINY_SEED)
    raw = yaml.safe_load(Path(TINY_CONFIG).read_text())
    small, large = list(raw["models"])[:2]
    raw["models"][small]["path"], raw["models"][large]["path"] = str(pair["small"]), str(pair["large"])
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


class _Stop(Exception):
    pass


def _raise_stop(signum: int, _frame: object) -> None:
    raise _Stop(signum)


def run(args: argparse.Namespace) -> int:
    if args.pools:
        parse_pools(args.pools)
        if args.replicas != 1 or args.gpus_per_replica:
            raise SystemExit("--pools splits one pair over workers: it takes no --replicas or --gpus-per-replica")
    if args.replicas < 1 and not args.no_workers:
        raise SystemExit("--replicas must be >= 1")
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="tokenrouter-fleet-")).resolve()
    (run_dir / "home").mkdir(parents=True, exist_ok=True)
    env = fleet_environment(args.discovery, run_dir)
    config = resolve_config(args, run_dir)
    if args.no_workers:
        workers = []
    elif args.pools:
        provide_pair_secret(env, run_dir)
        workers = pool_workers(config, args.served_model_name, run_dir, args.worker_status_port,
                               *parse_pools(args.pools))
    else:
        workers = [Process(f"worker {i}", worker_command(config, args.served_model_name), run_dir / f"worker-{i}.log",
                           env=worker_environment(i, args.worker_status_port, args.gpus_per_replica))
                   for i in range(args.replicas)]
    if args.worker_status_port + len(workers) - 1 > MAX_STATUS_PORT:
        raise SystemExit(f"--worker-status-port: Dynamo 1.6.1 reads DYN_SYSTEM_PORT as a signed 16-bit number; "
                         f"the last worker's port must be <= {MAX_STATUS_PORT}")
    frontend = None if args.no_frontend else Process("frontend", frontend_command(args), run_dir / "frontend.log")
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGINT, _raise_stop)
    try:
        for process in ([frontend] if frontend else []) + workers:
            process.start(env)
        where = f"http://{args.host}:{args.http_port}/v1" if frontend else "this host's workers"
        what = f"pools {args.pools}" if args.pools else f"{len(workers)} replica(s)"
        print(f"tokenrouter fleet: {what}, {where}, logs in {run_dir}", file=sys.stderr, flush=True)
        while True:
            time.sleep(WATCH_PERIOD_S)
            if frontend and not frontend.alive:
                print(f"tokenrouter fleet: the frontend exited ({frontend.returncode}); see {frontend.log}",
                      file=sys.stderr, flush=True)
                return 1
            for worker in workers:
                if not worker.alive:
                    _restart(worker, env)
    except _Stop:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for worker in workers:  # all at once: each drains in parallel
            worker.terminate()
        for worker in workers:
            worker.stop(args.drain_timeout)
        if frontend:
            frontend.stop(args.drain_timeout)
    return 0


def _restart(worker: Process, env: dict[str, str]) -> None:
    now = time.monotonic()
    worker.restarts = [t for t in worker.restarts if now - t < 600.0]
    delay = RESTART_BACKOFF_S[min(len(worker.restarts), len(RESTART_BACKOFF_S) - 1)]
    if worker.restarts and now - worker.restarts[-1] < delay:
        return  # its turn comes on a later watch
    print(f"tokenrouter fleet: {worker.name} exited ({worker.returncode}); starting it again",
          file=sys.stderr, flush=True)
    worker.restarts.append(now)
    worker.start(env)
