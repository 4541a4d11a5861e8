"""The echo server, shared by the e2e modules that test the fronts' shapes (stopped at the folder's end)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from helpers.servers import add_third_party_fronts, render_echo_repository, start_triton
from tokenrouter.launch.triton_server import TritonServer


@pytest.fixture(scope="package")
def echo_server(backend_dir: Path, tiny_tokenizer: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """The echo repository (helpers/echo_subserver_double.py) with the third-party clients' fronts."""
    repository = add_third_party_fronts(render_echo_repository(tmp_path_factory.mktemp("echo-repo"), tiny_tokenizer))
    server = start_triton(repository, backend_dir, tmp_path_factory.mktemp("echo-log"), 180)
    yield server
    server.stop()
