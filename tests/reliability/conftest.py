"""The reliability suite: hostile and unlucky clients against a real Triton server (tiny pair).

The short version runs by default; the long one (every stub kill, the soak) is marked slow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from e2e.conftest import add_unary_core, add_unary_front, backend_dir  # noqa: F401 - the e2e suite's backend folder
from e2e.test_routing_server import routing_config
from tokenrouter.serving.repository import render_repository
from tokenrouter.launch.triton_install import find_triton
from tokenrouter.launch.triton_server import Ports, TritonServer


@pytest.fixture(scope="session")
def routing_server(backend_dir: Path, tiny_pair: dict[str, Path],  # noqa: F811
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """The tiny pair behind the python_router subservers, routing 30 % of positions to llm, with the
    default fronts, a unary one and a unary tensorrt_llm; one for the whole suite (a start costs tens of
    seconds here). Its log goes to a file. tensorrt_llm wraps ids past the vocabulary, as TensorRT-LLM's
    synthetic benchmark workloads need (test_trt_llm_tools.py); the refusal by default is a unit test's."""
    config = routing_config(tiny_pair)
    config["frontend"] = {**config["frontend"], "out_of_vocabulary_ids": "wrap"}
    repository = add_unary_core(add_unary_front(render_repository(config, tmp_path_factory.mktemp("routing-repo"))))
    log = (tmp_path_factory.mktemp("routing-log") / "server.log").open("w")
    server = TritonServer(repository, backend_dir, find_triton(), Ports.free(), host="127.0.0.1",
                          log_sink=lambda line: (log.write(line + "\n"), log.flush()), exit_timeout_s=5)
    server = server.start_ready(300)  # as `tokenrouter serve` starts it: an aborted start is retried
    yield server
    server.stop()
    log.close()
