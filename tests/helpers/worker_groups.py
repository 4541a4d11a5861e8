"""How the suite is split between pytest-xdist workers: a file at a time (its module-scoped servers start
once), except that the files sharing one session-scoped server or engine set all go to the same worker, so
that only one worker starts it (a tiny routing server costs ~12 s of CPU to start, the vLLM engines ~40 s).

A file belongs to a group when its source names the group's fixture. A file that reaches the fixture
only through another fixture defined elsewhere is missed: it then runs where it is sent and, at worst,
its worker starts the server a second time.

Work goes out in collection order (the slow files first: tests/conftest.py) rather than xdist's default
of the scopes with the most tests first, which left the longest single-test files to the end.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from xdist.scheduler import LoadScopeScheduling

TESTS = Path(__file__).resolve().parents[1]

# group -> the fixtures whose one instance its files share (tests/conftest.py, tests/e2e/conftest.py)
SHARED_FIXTURES = {
    "routing server": ("routing_server", "openai_api"),
    "vLLM engines": ("vllm_tiny_engines",),
    "echo server": ("echo_server",),
    "supervised launcher": ("supervised_launcher",),
}


@functools.cache
def group_of(path: str) -> str | None:
    """The group of the test file at ``path`` (relative to the rootdir, as in a node id), or None."""
    try:
        source = (TESTS.parent / path).read_text()
    except OSError:
        return None
    for group, fixtures in SHARED_FIXTURES.items():
        if any(re.search(rf"\b{fixture}\b", source) for fixture in fixtures):
            return group
    return None


class FilesAndSharedServers(LoadScopeScheduling):
    """xdist's scope scheduling with a scope per file, or per group for the files of a group."""

    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False  # keep collection order

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        return group_of(path) or path
