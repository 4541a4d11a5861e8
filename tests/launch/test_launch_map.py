"""docs/runtime.md's map of the package names every file of launch/ and what it does: a file missing from
it is one a newcomer cannot place (serving/'s files are held to the same map in test_serving_layout.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import tokenrouter

LAUNCH = Path(tokenrouter.__file__).parent / "launch"
RUNTIME_DOC = LAUNCH.parents[3] / "docs" / "runtime.md"


@pytest.mark.parametrize("path", sorted(LAUNCH.glob("*.py")), ids=lambda path: path.name)
def test_each_launch_file_is_on_the_map(path: Path) -> None:
    if path.name == "__init__.py":
        return
    assert f"`launch/{path.name}`" in RUNTIME_DOC.read_text(), f"launch/{path.name} is not on docs/runtime.md's map"
