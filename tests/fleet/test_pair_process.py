"""The pair in a child process of its Dynamo worker: frames, the outbox, and the process's life.

Oracles: every committed token reaches the worker once and in order, with its ending; a pair whose
process dies ends its open requests with an error and tells the worker. (A killed worker's pair exiting
with it, and a drained one's, are held end to end in test_fleet_e2e.py.)"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import socket
from pathlib import Path

import pytest

from tokenrouter.fleet.frames import BlockingChannel, encode, read_frame
from tokenrouter.fleet.launcher import tiny_config
from tokenrouter.fleet.pair_host import Outbox
from tokenrouter.fleet.pair_process import PairProcess
from tokenrouter.runtime.api import RequestHandle

pytestmark = pytest.mark.timeout(120)
PROMPT = [321, 784, 10, 67, 14, 301, 309]


def test_frames_round_trip_and_a_cut_frame_is_an_end():
    data = encode(("out", [(1, [5, 6], [0, 1], None, None, None)], [])) + encode(("close",))
    stream = io.BytesIO(data)
    assert read_frame(stream) == ("out", [(1, [5, 6], [0, 1], None, None, None)], [])
    assert read_frame(stream) == ("close",)
    with pytest.raises(EOFError):
        read_frame(stream)
    cut = io.BytesIO(data[:-3])
    read_frame(cut)
    with pytest.raises(EOFError):
        read_frame(cut)


def test_outbox_sends_each_token_once_in_order_with_the_ending_and_the_refusals():
    ours, theirs = socket.socketpair()
    outbox, reader = Outbox(BlockingChannel(ours)), BlockingChannel(theirs)
    first, second = RequestHandle("a", None), RequestHandle("b", None)
    first.on_output([7], [0], logprobs=[-0.5])  # before it is followed: still sent
    outbox.start()
    outbox.follow(1, first)
    outbox.follow(2, second)
    received: dict[int, list] = {1: [], 2: []}
    endings, refused, messages = {}, [], 0

    def read_until(done) -> None:
        nonlocal messages, refused
        while not done():
            kind, outputs, refusals = reader.receive()
            assert kind == "out"
            messages += 1
            refused += refusals
            for key, tokens, origins, logprobs, finish_reason, error in outputs:
                assert key not in endings  # nothing after a request's ending
                assert len(origins) == len(tokens) and (logprobs is None) == (key == 2)
                received[key] += tokens
                if finish_reason is not None:
                    endings[key] = (finish_reason, error)

    for step in range(20):  # one step's rows at a time, each read before the next: many messages
        first.on_output([step], [step % 2], logprobs=[-1.0])
        second.on_output([100 + step], [0])
        read_until(lambda: len(received[2]) >= step + 1)
    first.on_output([99], [0], finish_reason="length", logprobs=[-2.0])
    second.on_output([], [], finish_reason="error", error="boom")
    outbox.refuse(3, "invalid", "top_p: must be in (0, 1]")
    read_until(lambda: len(endings) == 2 and refused)
    outbox.stop()
    assert messages >= 20
    assert received[1] == [7, *range(20), 99] and received[2] == [100 + s for s in range(20)]
    assert endings == {1: ("length", None), 2: ("error", "boom")}
    assert refused == [(3, "invalid", "top_p: must be in (0, 1]")]
    assert outbox.handle(1) is None and outbox.handle(2) is None  # finished requests are dropped


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
