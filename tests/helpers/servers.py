"""Test repositories and the servers on them: the echo repository, unary twins of the fronts and of
``tensorrt_llm``, a Triton server or an OpenAI server on free loopback ports with its log in a file."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Iterator

from tokenrouter.config import FrontendSpec
from tokenrouter.launch.free_ports import free_port
from tokenrouter.launch.openai_process import OpenAIServer
from tokenrouter.launch.triton_install import find_triton
from tokenrouter.launch.triton_server import Ports, TritonServer
from tokenrouter.serving.repository import (CORE_MODEL, model_parameters, render_frontend, subserver_config,
                                           write_core_model, write_front, write_model)
from tokenrouter.serving.schema import EXCLUDE_INPUT

ECHO_DOUBLE = Path(__file__).with_name("echo_subserver_double.py")

OPENAI_KEY = "test-key-1234"  # the shared OpenAI server's API key (tests/conftest.py: openai_api)

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


def render_lean_echo_repository(out: Path, tokenizer: Path) -> Path:
    """The echo repository cut to the decoupled front `tokenrouter` and the echo double: for tests of the
    launcher (start, restart, stop) rather than of the fronts, where each stub fewer saves seconds a start."""
    render_echo_repository(out, tokenizer)
    for model in ("preprocessing", "postprocessing", UNARY):
        shutil.rmtree(out / model)
    return out


# Fronts the third-party client shapes need beside `tokenrouter` and the unary one: one rendered as
# Triton's OpenAI frontend needs it (frontend.exclude_input_in_output true), one with chat_template on.
OPENAI_FRONT, CHAT_FRONT = "openai_front", "chat_front"


def add_third_party_fronts(repository: Path) -> Path:
    """OPENAI_FRONT and CHAT_FRONT with the parameters of front `tokenrouter` otherwise."""
    base = model_parameters(repository / "tokenrouter")
    write_front(repository, OPENAI_FRONT, {**base, EXCLUDE_INPUT: True}, decoupled=True, max_batch_size=8)
    write_front(repository, CHAT_FRONT, {**base, "chat_template": True}, decoupled=True, max_batch_size=8)
    return repository


def start_triton(repository: Path, backend_dir: Path, log_dir: Path, timeout_s: float) -> TritonServer:
    """A ready TritonServer on ``repository`` (free loopback ports); its log goes to log_dir/server.log.
    A server that does not get ready fails with its log tail; an aborted start is retried, as
    `tokenrouter serve` starts it."""
    log = (log_dir / "server.log").open("w")
    server = TritonServer(repository, backend_dir, find_triton(), Ports.free(), host="127.0.0.1",
                          log_sink=lambda line: (log.write(line + "\n"), log.flush()), exit_timeout_s=5)
    return server.start_ready(timeout_s)


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
