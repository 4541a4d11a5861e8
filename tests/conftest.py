"""Shared fixtures: tiny model pairs built once per machine (see engines/tiny.py), and the real
Triton servers on them: one routing server for the whole session, and a module's own servers.

A server start costs 10-30 s here (~9 Python stubs; the engines' import torch): a test that
only needs *a* routing server uses ``routing_server`` (and ``openai_api``, the OpenAI server on it); a
module starts its own (``start_server``) only for a repository of its own or to change the server's
state (stop, reload, kill).

``python -m pytest -q`` runs the suite in two pytest-xdist workers (``-n 2`` in pyproject.toml; ``-n 0``:
one process), a file per worker at a time, the files that share a session server on one worker
(helpers/worker_groups.py); each worker starts its own session servers and picks ports from its own half
of the free range (``TOKENROUTER_PORT_SLICE``). Files that start servers or engines come first and the
many quick unit files fill the gaps after them, so that neither worker is left with a long file at the end."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator

import pytest

from helpers.routing import routing_config
from helpers.servers import OPENAI_KEY, add_unary_core, add_unary_front, openai_server, start_triton
from helpers.worker_groups import FilesAndSharedServers
from tokenrouter.launch.free_ports import SLICE_VARIABLE
from tokenrouter.launch.triton_install import build_backend_dir, find_triton
from tokenrouter.launch.openai_process import OpenAIServer
from tokenrouter.launch.triton_server import TritonServer
from tokenrouter.serving.repository import render_repository
from tokenrouter_engines.tiny import FAMILIES, ensure_tiny_pair

StartServer = Callable[..., TritonServer]


# folders and file names of the tests that start servers, engines or benchmarks (tens of seconds each)
SLOW_FILES = ("e2e/", "reliability/", "fleet/", "bench/", "vllm", "tensor_parallel", "docker/")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slow files first, each file's tests kept together and in order (a stable sort)."""
    def slow_first(item: pytest.Item) -> bool:
        path = item.nodeid.split("::")[0]
        return not any(part in path for part in SLOW_FILES)

    items.sort(key=slow_first)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> FilesAndSharedServers | None:
    return FilesAndSharedServers(config, log) if config.getoption("dist") in ("load", "loadfile") else None


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ... in an xdist worker
    if worker:  # inherited by every server and process the worker starts
        os.environ[SLICE_VARIABLE] = f"{worker.removeprefix('gw')}/{os.environ['PYTEST_XDIST_WORKER_COUNT']}"


@pytest.fixture(scope="session")
def tiny_pair_factory() -> Callable[..., dict[str, Path]]:
    """``factory(family="qwen3", seed=0) -> {"small": dir, "large": dir}``, cached on disk."""
    return ensure_tiny_pair


@pytest.fixture(scope="session")
def tiny_pair() -> dict[str, Path]:
    """The default tiny pair (qwen3, seed 0)."""
    return ensure_tiny_pair("qwen3", 0)


@pytest.fixture(scope="session", params=FAMILIES)
def tiny_pair_family(request: pytest.FixtureRequest) -> tuple[str, dict[str, Path]]:
    """Each supported family's tiny pair in turn: (family, paths)."""
    return request.param, ensure_tiny_pair(request.param, 0)


@pytest.fixture(scope="session")
def vllm_tiny_engines(tiny_pair: dict[Path, Path]):
    """The default tiny pair on the vLLM engine, one process per model (started together, ~30 s),
    shared by the whole session: tests release what they add. {"small": engine, "large": engine}."""
    from concurrent.futures import ThreadPoolExecutor

    from tokenrouter.config import ModelSpec
    from tokenrouter.engine.factory import create_engine

    def start(size: str):
        # float32: the oracle tests compare these engines with transformers in float32
        spec = ModelSpec(path=str(tiny_pair[size]), engine="vllm", dtype="float32", kv_cache_tokens=8192, threads=1)
        return create_engine(size, spec)

    with ThreadPoolExecutor(2) as pool:
        engines = dict(zip(("small", "large"), pool.map(start, ("small", "large"))))
    yield engines
    for engine in engines.values():
        engine.close()


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
    """start_server(repository, timeout_s=...) -> a ready TritonServer; all are stopped at module end."""
    servers: list[TritonServer] = []

    def start(repository: Path, timeout_s: float = 180.0) -> TritonServer:
        server = start_triton(repository, backend_dir, tmp_path_factory.mktemp("triton-log"), timeout_s)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def routing_server(backend_dir: Path, tiny_pair: dict[str, Path],
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """``routing_config(tiny_pair)`` (the tiny pair behind the python_router subservers, routing 30 % of
    positions to llm) with the default front, a unary one and a unary tensorrt_llm: one server for the
    whole session. Tests leave it as they found it (requests ended, pools idle). tensorrt_llm wraps ids
    past the vocabulary, as TensorRT-LLM's synthetic benchmark workloads need (test_trt_llm_tools.py);
    the refusal by default is a unit test's."""
    config = routing_config(tiny_pair)
    config["frontend"] = {**config["frontend"], "out_of_vocabulary_ids": "wrap"}
    repository = add_unary_core(add_unary_front(render_repository(config, tmp_path_factory.mktemp("routing-repo"))))
    server = start_triton(repository, backend_dir, tmp_path_factory.mktemp("routing-log"), 300)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def openai_api(routing_server: TritonServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenAIServer]:
    """The OpenAI-compatible server on ``routing_server``'s fronts (key ``OPENAI_KEY``), one for the whole
    session: tests that count the routing server's metrics count differences, as with ``routing_server``."""
    with openai_server(routing_server, tmp_path_factory.mktemp("openai-log"), api_key=OPENAI_KEY) as server:
        yield server
