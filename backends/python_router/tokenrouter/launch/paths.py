"""Where the command line finds its files.

Shipped files (the configs, the Triton backend's model file, the model recipes) come from the installed
packages, so a plain ``pip install .`` works from any folder. Work files live in the project
folder, the current directory: the model repository ``tokenrouter serve`` serves by default
(``model_repository/``, which also holds trained routers) and run-time state (``.runtime/``, or
``$TOKENROUTER_HOME``). In a checkout, run the CLI from its root, as the docs do.
"""

from __future__ import annotations

import importlib.util
import os
from importlib import resources
from pathlib import Path

STATE_ENV = "TOKENROUTER_HOME"


def shipped_config(name: str) -> Path:
    """A config that ships with the package (``configs/`` in the source tree), e.g. ``tiny.yaml``."""
    path = Path(str(resources.files("tokenrouter.configs") / name))
    if not path.is_file():
        raise FileNotFoundError(f"no shipped config named {name!r} (have: {', '.join(shipped_configs())})")
    return path


def shipped_configs() -> list[str]:
    return sorted(entry.name for entry in resources.files("tokenrouter.configs").iterdir()
                  if entry.name.endswith(".yaml"))


def backend_model_file() -> Path:
    """The file Triton loads as ``python_router/model.py`` (found without importing Triton's utils)."""
    spec = importlib.util.find_spec("tokenrouter.serving.subserver.backend_model")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin)


def runtime_dir() -> Path:
    """Rendered repositories, backend folders of running servers, the stub environment."""
    return Path(os.environ.get(STATE_ENV) or Path.cwd() / ".runtime").resolve()


def model_repository_dir() -> Path:
    """The repository served when nothing else is named (the checkout's, in a checkout)."""
    return Path.cwd() / "model_repository"


def routers_dir() -> Path:
    """Where trained routers go and are read from: the routing_policy model's version folder."""
    return model_repository_dir() / "routing_policy" / "1"
