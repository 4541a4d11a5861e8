"""The pair in a child process of its Dynamo worker: the process's life (its pipe, at unit level:
test_pair_messages_unit.py).

Oracle: a pair whose process dies ends its open requests with an error and tells the worker. (A killed
worker's pair exiting with it, and a drained one's, are held end to end in test_fleet_e2e.py.)"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from tokenrouter.fleet.launcher import tiny_config
from tokenrouter.fleet.pair_process import PairProcess

pytestmark = pytest.mark.timeout(120)
PROMPT = [321, 784, 10, 67, 14, 301, 309]


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_config(tmp_path_factory.mktemp("pair"))


def test_a_dead_pair_ends_its_open_requests_and_tells_the_worker(config):
    lost: list[str] = []

    async def run() -> tuple[str | None, tuple[str, str] | None]:
        pair = await PairProcess.start(config, on_lost=lost.append)
        stream = pair.submit(PROMPT, {"max_tokens": 900, "ignore_eos": True})
        await stream.changed.wait()  # it runs
        os.kill(pair.pid, signal.SIGKILL)
        await asyncio.wait_for(stream.ended.wait(), 10)
        after = pair.submit(PROMPT, {"max_tokens": 2})
        await pair.close()
        return stream.refusal, after.refusal

    refusal, after = asyncio.run(run())
    assert refusal[0] == "error" and "exited" in refusal[1]
    assert after[0] == "error"  # a submit after the loss is refused at once, not left waiting
    assert len(lost) == 1 and "exited" in lost[0]
