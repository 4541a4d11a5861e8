"""One `tokenrouter serve` for the tests that break its server and watch the supervisor heal it (a killed
stub, a dead subserver loop, a reload): each leaves a server that comes back, so they share the launcher
and pay its start once (tests/helpers/worker_groups.py sends their files to one worker)."""

from __future__ import annotations

from typing import Iterator

import pytest

from helpers.launcher import stop
from helpers.supervised import Supervised


@pytest.fixture(scope="package")
def supervised_launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervised]:
    folder = tmp_path_factory.mktemp("supervised")
    # --drain-timeout: the reload test's drain, whose requests in flight finish whole
    served = Supervised(folder / "repo", folder / "break-now", "--drain-timeout=120")
    yield served
    stop(served.process, timeout_s=120)
