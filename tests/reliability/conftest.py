"""The reliability suite: hostile and unlucky clients against a real Triton server (tiny pair).

Servers come from the e2e fixtures (free loopback ports, stopped at module end). The short
version runs by default; ``-m soak`` runs the long one (CI skips it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.conftest import backend_dir, start_server  # noqa: F401 - fixtures shared with the e2e suite
from e2e.test_routing_server import routing_config
from tokenrouter.serving.repository import render_repository


@pytest.fixture(scope="module")
def routing_server(start_server, tiny_pair: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):  # noqa: F811
    """The tiny pair behind the python_router subservers, routing 30 % of positions to llm."""
    return start_server(render_repository(routing_config(tiny_pair), tmp_path_factory.mktemp("routing-repo")))
