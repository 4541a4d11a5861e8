"""One `tokenrouter serve` for the tests that break its server and watch the supervisor heal it (a killed
stub, a dead subserver loop, a reload): each leaves a server that comes back, so they share the launcher
and pay its start once (tests/helpers/worker_groups.py sends their files to one worker)."""

from __future__ import annotations

import threading
from typing import Iterator

import pytest

from helpers.launcher import launch, stop
from helpers.supervised import Supervised, breakable_repository


@pytest.fixture(scope="package")
def supervised_launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervised]:
    folder = tmp_path_factory.mktemp("supervised")
    trigger = folder / "break-now"
    repository = breakable_repository(folder / "repo", trigger)
    # the reload test's drain: its requests in flight finish whole
    launcher, ports = launch("--model-repository", str(repository), "--drain-timeout=120")
    served = Supervised(launcher, ports, repository, trigger)
    # kept read: a full pipe would block the launcher's log forwarding
    threading.Thread(target=lambda: served.log.extend(launcher.stdout), daemon=True).start()
    yield served
    stop(launcher, timeout_s=120)
