"""Real Triton servers on free loopback ports, started for a given repository and torn down after."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable, Iterator

import pytest

from tokenrouter.config import FrontendSpec
from tokenrouter.serving.repository import (CORE_MODEL, model_parameters, render_frontend, subserver_config,
                                           write_core_model, write_front, write_model)
from tokenrouter.launch.openai_process import OpenAIServer, free_port
from tokenrouter.launch.triton_install import build_backend_dir, find_triton
from tokenrouter.launch.triton_server import Ports, TritonServer

ECHO_DOUBLE = Path(__file__).with_name("echo_subserver_double.py")
StartServer = Callable[..., TritonServer]


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_pair: dict[str, Path]) -> Path:
    """The tiny pair's tokenizer: a byte-level BPE with ChatML specials."""
    return tiny_pair["small"]


@pytest.fixture(scope="session")
def backend_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # python_router is placed only when its model.py exists: the echo repository does not need it
    from tokenrouter.launch.triton_install import BACKEND_MODEL_FILE

    model_file = BACKEND_MODEL_FILE if BACKEND_MODEL_FILE.is_file() else None
    return build_backend_dir(find_triton(), tmp_path_factory.mktemp("backends") / "backends", model_file)


@pytest.fixture(scope="module")
def start_server(backend_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartServer]:
    """start_server(repository, timeout_s=...) -> a ready TritonServer; all are stopped at module end.

    The server log goes to a file; a server that does not get ready fails with its log tail."""
    servers: list[TritonServer] = []

    def start(repository: Path, timeout_s: float = 180.0) -> TritonServer:
        log = (tmp_path_factory.mktemp("triton-log") / "server.log").open("w")
        server = TritonServer(repository, backend_dir, find_triton(), Ports.free(), host="127.0.0.1",
                              log_sink=lambda line: (log.write(line + "\n"), log.flush()), exit_timeout_s=5)
        server = server.start_ready(timeout_s)  # as `tokenrouter serve` starts it: an aborted start is retried
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


UNARY = "unary"  # a unary front next to the decoupled `tokenrouter` in the test repositories


def add_unary_front(repository: Path, like: str = "tokenrouter") -> Path:
    """A unary front named UNARY with the parameters of front ``like`` (one server tests both modes)."""
    write_front(repository, UNARY, model_parameters(repository / like), decoupled=False, max_batch_size=8)
    return repository


UNARY_CORE = "tensorrt_llm_unary"  # a unary tensorrt_llm next to the decoupled one


def add_unary_core(repository: Path) -> Path:
    """A unary twin of ``tensorrt_llm`` named UNARY_CORE (TensorRT-LLM's token-level tools in their unary
    modes, ``frontend.decoupled: false``, without a second server)."""
    write_core_model(repository, UNARY_CORE, model_parameters(repository / CORE_MODEL), decoupled=False,
                     max_batch_size=8)
    return repository


def render_echo_repository(out: Path, tokenizer: Path, *, chat_template: bool = False) -> Path:
    """The decoupled front `tokenrouter`, a unary front, preprocessing and postprocessing in front
    of the echo double."""
    render_frontend(out, entry="echo", tokenizer=str(tokenizer), chat_template=chat_template,
                    frontend=FrontendSpec(names=["tokenrouter"], max_batch_size=8))
    write_model(out, subserver_config("echo", {}, backend="python"), {"model.py": ECHO_DOUBLE})
    return add_unary_front(out)


@pytest.fixture(scope="module")
def echo_server(start_server: StartServer, tiny_tokenizer: Path,
                tmp_path_factory: pytest.TempPathFactory) -> TritonServer:
    return start_server(render_echo_repository(tmp_path_factory.mktemp("echo-repo"), tiny_tokenizer))


@contextlib.contextmanager
def openai_server(triton: TritonServer, log_dir: Path, api_key: str | None = None) -> Iterator[OpenAIServer]:
    """The OpenAI-compatible server on ``triton``'s fronts, on a free loopback port, as `tokenrouter
    serve` starts it (its own process); its log goes to a file."""
    log = (log_dir / "openai-server.log").open("w")
    server = OpenAIServer(triton.repository, triton.grpc_url, port=free_port(), api_key=api_key, drain_timeout_s=5,
                          log_sink=lambda line: (log.write(line + "\n"), log.flush()))
    try:
        yield server.start().wait_ready(240)
    finally:
        server.stop(grace_s=5)
        log.close()
