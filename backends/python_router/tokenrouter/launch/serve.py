"""`tokenrouter serve`: run Triton with a TokenRouter model repository until Ctrl-C or SIGTERM.

Beside Triton it starts the OpenAI-compatible server (tokenrouter.openai_server, port 9000;
--no-openai: not). While it runs, a dead tritonserver, Python stub or OpenAI server is restarted
(supervisor.py); SIGTERM/Ctrl-C refuses new requests and drains those in flight (--drain-timeout),
on both servers, before stopping. SIGHUP applies edits of the repository's config.pbtxt files: the
same drain, then tritonserver starts again (no client can load or unload a model: triton_server.py, MODEL_CONTROL).

    tokenrouter serve                         the real Qwen2.5-Coder pair (fetched and converted once)
    tokenrouter serve --tiny                  a tiny random pair, ready in seconds
    tokenrouter serve --config my.yaml        any config, rendered to a repository first
    tokenrouter serve --model-repository DIR  a repository as it is (edit its config.pbtxt, restart)
    tokenrouter serve --config pair.yaml --only llm   one node of a deployment over several servers
                                              (models.<name>.server; docs/deploy.md, two hosts)
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from tokenrouter.config import ConfigError, TokenRouterConfig, load_config
from tokenrouter.serving.pair_secret import PairSecretError, pair_secret
from tokenrouter.serving.repository import CORE_MODEL, read_repository, render_repository, served_models

from tokenrouter.openai_server.app import API_KEY_ENV, API_KEY_FILE_ENV, read_api_key

from .errors import TritonError
from .openai_process import DEFAULT_PORT as OPENAI_PORT
from .openai_process import OpenAIServer
from .paths import model_repository_dir, runtime_dir, shipped_config
from .supervisor import Supervisor
from .triton_install import BACKEND_MODEL_FILE, build_backend_dir, find_triton
from .triton_server import Ports, TritonServer, write_lines

RUNTIME = runtime_dir()
DEFAULT_REPOSITORY = model_repository_dir()
DEFAULT_CONFIG = shipped_config("qwen2.5-coder.yaml")
TINY_CONFIG = shipped_config("tiny.yaml")
TINY_FAMILY, TINY_SEED = "qwen3", 0
ENDING_GRACE_S = 5.0  # after the drain timeout: for the requests' errors to reach their clients
# tritonserver's own wait when it stops: the drain has ended every request by then, so all it would wait
# for is idle clients (an idle HTTP keep-alive connection, or a gRPC stream, holds it for its whole
# exit timeout, 10 s by default) and the unloading of the models, which nothing needs
EXIT_TIMEOUT_S = 3


class _Stop(Exception):
    """Raised in the main thread by SIGINT/SIGTERM."""


def configure(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--config", help="YAML config to render and serve (see configs/)")
    source.add_argument("--tiny", action="store_true", help="a tiny random model pair, ready in seconds")
    parser.add_argument("--model-repository", metavar="DIR",
                        help="serve DIR as it is; with --config/--tiny: render into DIR "
                             "(default: model_repository/, or .runtime/repositories/<name> when rendering)")
    parser.add_argument("--only", type=lambda text: text.split(","), metavar="MODEL[,MODEL]",
                        help="with --config: serve only this node's models (those that share one "
                             "models.<name>.server), and the fronts when the entry model is one of them")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: this machine only); 0.0.0.0 opens the "
                             "server to the network, which has no authentication of its own")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument("--openai-port", type=int, default=OPENAI_PORT,
                        help=f"the OpenAI-compatible API (/v1/chat/completions, ...; default {OPENAI_PORT})")
    parser.add_argument("--no-openai", action="store_true", help="do not start the OpenAI-compatible server")
    parser.add_argument("--api-key-file", default=os.environ.get(API_KEY_FILE_ENV), metavar="PATH",
                        help=f"the OpenAI API then requires 'Authorization: Bearer KEY', KEY read from PATH "
                             f"(default: ${API_KEY_FILE_ENV}, else the key in ${API_KEY_ENV}; neither: no key). "
                             "Triton's own ports have no authentication")
    parser.add_argument("--api-key", help=argparse.SUPPRESS)  # refused in run(): a key on a command line
    parser.add_argument("--drain-timeout", type=float, default=30.0, metavar="S",
                        help="on SIGTERM/Ctrl-C: seconds that requests in flight get to finish while new ones "
                             "are refused; the rest then end with 'the server is shutting down' (default 30)")
    parser.add_argument("--ready-timeout", type=float, default=900.0, metavar="S",
                        help="seconds to wait for all models to load (default 900)")
    parser.add_argument("--triton-arg", action="append", default=[], metavar="ARG",
                        help="extra tritonserver argument, e.g. --triton-arg=--log-verbose=1 (repeatable)")


def _with_pair(config_path: Path, pair: dict[str, Path]) -> TokenRouterConfig:
    """The config with its first two models' paths set to the pair's small and large folders."""
    config = load_config(config_path)
    small, large = config.model_names[:2]
    config.models[small].path = str(Path(pair["small"]).resolve())
    config.models[large].path = str(Path(pair["large"]).resolve())
    return config


def _check_paths(config: TokenRouterConfig, only: list[str] | None = None) -> None:
    for name, spec in config.models.items():
        if spec.path and not Path(spec.path).exists() and (not only or name in only):
            raise ConfigError(f"model '{name}': {spec.path} does not exist "
                              f"(the default pair installs with `tokenrouter models pull`, the GPU configs' "
                              f"checkpoints with `tokenrouter models download`)")


def _render(config: TokenRouterConfig, out: str | None, name: str, only: list[str] | None = None) -> Path:
    _check_paths(config, only)
    if only:
        name = f"{name}-{'-'.join(only)}"
    return render_repository(config, Path(out) if out else RUNTIME / "repositories" / name, only=only)


def prepare_repository(args: argparse.Namespace) -> Path:
    """The repository folder to serve, rendering it and installing models where needed."""
    if args.only and not args.config:
        raise ConfigError("--only picks one node of a --config whose models say where they run")
    if args.tiny:
        from tokenrouter_engines.tiny import ensure_tiny_pair

        print("tokenrouter serve: preparing the tiny pair", file=sys.stderr)
        return _render(_with_pair(TINY_CONFIG, ensure_tiny_pair(TINY_FAMILY, TINY_SEED)), args.model_repository, "tiny")
    if args.config:
        return _render(load_config(args.config), args.model_repository, Path(args.config).stem, args.only)
    if args.model_repository:
        return Path(args.model_repository).resolve()
    from tokenrouter_engines.models import ensure_real_pair

    config = _with_pair(DEFAULT_CONFIG, ensure_real_pair(progress=True))
    if DEFAULT_REPOSITORY.is_dir() and read_repository(DEFAULT_REPOSITORY).models == config.models:
        return DEFAULT_REPOSITORY
    # no repository here (an installed package run from another folder), or the models were
    # installed elsewhere (TOKENROUTER_MODELS_DIR): point a rendering at them
    return _render(config, None, DEFAULT_CONFIG.stem)


def _remove_stale_runtime_dirs() -> None:
    """Backend folders of launchers that were killed before they could clean up."""
    for folder in RUNTIME.glob("serve-*"):
        pid = folder.name.removeprefix("serve-")
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(folder, ignore_errors=True)


def _raise_stop(signum: int, _frame: object) -> None:
    raise _Stop(signal.Signals(signum).name)


def _served_models(repository: Path) -> tuple[str | None, list[str]]:
    """The entry subserver and the fronts of a TokenRouter repository, when this server runs them
    (a node of a deployment over several servers may not); (None, []) for any other repository."""
    try:
        config = read_repository(repository)
        here = served_models(repository)
    except ConfigError:
        return None, []
    return (config.entry, config.frontend.names) if config.entry in here else (None, [])


def _needs_pair_secret(repository: Path) -> bool:
    """Whether this server's models have peers on other servers (they then need the pair secret)."""
    try:
        return set(served_models(repository)) != set(read_repository(repository).model_names)
    except ConfigError:
        return False


def _ignore_stop_signals() -> None:
    """A second Ctrl-C (or a reload) must not cut the drain or the shutdown short."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)


@dataclass
class _Launch:
    """What one `tokenrouter serve` runs: tritonserver, the OpenAI server beside it, and the models that
    a drain or an ending tells. ``server`` and ``api`` are the ones running now (a restart replaces them)."""

    args: argparse.Namespace
    repository: Path
    server: TritonServer
    api: OpenAIServer | None
    entry: str | None
    fronts: list[str]

    @property
    def doors(self) -> list[str]:
        """The models clients call: the fronts and TensorRT-LLM's core model; a drain or an ending tells each."""
        return [*self.fronts, CORE_MODEL] if self.fronts else []


def _refuse_key_on_command_line() -> int:
    print(f"tokenrouter serve: --api-key puts the key on the command line, which every local user can read "
          f"(/proc/<pid>/cmdline); put it in a file only you can read and pass --api-key-file PATH (or set "
          f"{API_KEY_FILE_ENV})", file=sys.stderr)
    return 2


def _prepare(args: argparse.Namespace) -> _Launch:
    """The repository, the Triton installation and its backend folder, and the servers to start (none
    started yet). Raises what a bad config, a missing Triton or a missing pair secret raise."""
    api_key = read_api_key(args.api_key_file)
    repository = prepare_repository(args)
    install = find_triton()
    model_file = BACKEND_MODEL_FILE if BACKEND_MODEL_FILE.is_file() else None
    if model_file is None:
        print(f"tokenrouter serve: warning: {BACKEND_MODEL_FILE} is missing; python_router models cannot load",
              file=sys.stderr)
    _remove_stale_runtime_dirs()
    backend_dir = build_backend_dir(install, RUNTIME / f"serve-{os.getpid()}" / "backends", model_file)
    if _needs_pair_secret(repository):
        pair_secret()  # here, not in a stub's load: the message says how to give it (start() moves it)
    server = TritonServer(repository, backend_dir, install, Ports(args.http_port, args.grpc_port, args.metrics_port),
                          host=args.host, log_sink=write_lines(sys.stderr), extra_args=tuple(args.triton_arg),
                          exit_timeout_s=EXIT_TIMEOUT_S)
    entry, fronts = _served_models(repository)  # read once: the ready line, the supervisor and the drain
    # an OpenAI API needs TokenRouter's fronts; it drains a little longer than Triton, whose errors it relays
    api = None if args.no_openai or not fronts else OpenAIServer(
        repository, server.grpc_url, host=args.host, port=args.openai_port, api_key=api_key,
        drain_timeout_s=args.drain_timeout + ENDING_GRACE_S, log_sink=write_lines(sys.stderr))
    return _Launch(args, repository, server, api, entry, fronts)


def _announce(line: str) -> None:
    print(f"tokenrouter serve: {line}", file=sys.stderr)


def _start(launch: _Launch) -> None:
    """Both servers started and ready; what to call them at said."""
    args, fronts = launch.args, launch.fronts
    _announce(f"{launch.server.install.binary} with {launch.repository}")
    launch.server = launch.server.start_ready(args.ready_timeout, say=_announce)
    front = fronts[0] if fronts else "<model>"
    if launch.api is not None:
        launch.api.start().wait_ready(args.ready_timeout)
    _announce(f"ready. HTTP {args.host}:{args.http_port} (POST /v2/models/{front}/generate, generate_stream), "
              f"gRPC {args.host}:{args.grpc_port}, metrics {args.host}:{args.metrics_port}/metrics. Ctrl-C stops.")
    if launch.api is not None:
        _announce(f"OpenAI API: {launch.api.url}/v1 (models {', '.join(fronts)}; "
                  f"{'Authorization: Bearer <key> required' if launch.api.api_key else 'no API key'})")
    _announce(f"to apply an edit of a config.pbtxt: kill -HUP {os.getpid()} (drains, then restarts tritonserver)")
    _announce(f"started in {launch.server.start_times.summary()}")
    if _needs_pair_secret(launch.repository):
        _announce(f"this node runs {', '.join(served_models(launch.repository))} of a deployment over several "
                  f"servers; it is whole while tokenrouter_peer_connected is 1 for every peer (metrics port)")


def _supervise(launch: _Launch, previous: dict[signal.Signals, Any]) -> NoReturn:
    """Watch both servers and restart what dies, and reload on SIGHUP, until a stop signal."""
    supervisor = Supervisor(launch.server, launch.entry, launch.doors, launch.args.ready_timeout, _announce,
                            openai=launch.api, drain_timeout_s=launch.args.drain_timeout)
    previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, lambda _signum, _frame: supervisor.request_reload())
    try:
        supervisor.run_forever()
    finally:
        launch.server, launch.api = supervisor.server, supervisor.openai  # the ones running now, for the drain


def _drain(launch: _Launch, stop: _Stop) -> None:
    """New requests refused, those in flight given the drain timeout; the rest ended with a reason."""
    server, api, doors, entry = launch.server, launch.api, launch.doors, launch.entry
    timeout_s = launch.args.drain_timeout
    print(f"tokenrouter serve: {stop}: refusing new requests, draining those in flight "
          f"(up to {timeout_s:g} s)", file=sys.stderr)
    _ignore_stop_signals()
    if api is not None:
        api.signal_stop()  # takes no new connection; its requests in flight drain with Triton's
    if not server.control.drain(doors, timeout_s, entry):
        reason = f"the server is shutting down; the request did not finish within {timeout_s:g} s"
        print("tokenrouter serve: drain timed out; ending the requests still in flight", file=sys.stderr)
        for door in doors:  # their clients, also those whose request has not reached the entry
            server.control.end_in_flight(door, reason)
        if entry is not None:
            server.control.end_in_flight(entry, reason)
        server.control.drain(doors, ENDING_GRACE_S, entry)  # their errors reach the clients through the fronts
    else:
        print("tokenrouter serve: drained", file=sys.stderr)
    if api is not None:
        api.stop(grace_s=ENDING_GRACE_S)
    print("tokenrouter serve: stopping tritonserver", file=sys.stderr)


def _stop(launch: _Launch, previous: dict[signal.Signals, Any]) -> None:
    """Both servers stopped, the signal handlers given back, the backend folder removed."""
    _ignore_stop_signals()
    if launch.api is not None:
        launch.api.stop(grace_s=0.0)
    launch.server.stop()
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    shutil.rmtree(launch.server.backend_dir.parent, ignore_errors=True)


def run(args: argparse.Namespace) -> int:
    if args.api_key is not None:
        return _refuse_key_on_command_line()
    try:
        launch = _prepare(args)
    except (ConfigError, TritonError, PairSecretError, ValueError) as err:
        print(f"tokenrouter serve: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C while models are fetched or converted
        return 130
    previous = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        _start(launch)
        _supervise(launch, previous)
    except _Stop as stop:
        _drain(launch, stop)
        return 0
    except TritonError as err:
        print(f"tokenrouter serve: {err}", file=sys.stderr)
        return 1
    finally:
        _stop(launch, previous)
