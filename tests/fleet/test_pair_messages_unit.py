"""The pipe between a Dynamo worker and its pair's process, at unit level (no process is started): frames,
the typed messages both ways through real socket pairs, the outbox, and each receiving end, which takes
each kind it knows and refuses any other by name (the ends would run different code).

Oracles: every committed token reaches the worker once and in order, with its ending; a message is the same
message after the trip; an unknown one never hangs the other end. (The process's life: test_pair_process.py.)"""

from __future__ import annotations

import asyncio
import io
import socket
import threading

import pytest

from tokenrouter.fleet.frames import BlockingChannel, encode, read_frame
from tokenrouter.fleet.pair_host import Outbox, answer_control, serve, take_requests
from tokenrouter.fleet.pair_messages import AskStats, Cancel, Close, ControlError, Failed, Out, Ready, Stats, Submit
from tokenrouter.fleet.pair_process import PairProcess, PairProcessError
from tokenrouter.pipe_messages import UnknownMessage
from tokenrouter.request_builder import RequestError
from tokenrouter.runtime.api import RequestHandle

pytestmark = pytest.mark.timeout(60)
OUT = Out([(1, [5, 6], [0, 1], None, None, None)], [(2, "busy", "the queue is full")])


def pipe() -> tuple[BlockingChannel, BlockingChannel]:
    ours, theirs = socket.socketpair()
    return BlockingChannel(ours), BlockingChannel(theirs)


def test_frames_round_trip_and_a_cut_frame_is_an_end():
    data = encode(OUT) + encode(Close())
    stream = io.BytesIO(data)
    assert read_frame(stream) == OUT
    assert read_frame(stream) == Close()
    with pytest.raises(EOFError):
        read_frame(stream)
    cut = io.BytesIO(data[:-3])
    read_frame(cut)
    with pytest.raises(EOFError):
        read_frame(cut)


@pytest.mark.parametrize("message", [
    Submit(3, [321, 784], {"max_tokens": 4, "temperature": 0.5}), Cancel(3), Close(),
    Ready(max_model_len=2048, block_size=16, num_total_blocks=900), Failed("ValueError: no such model"), OUT,
    AskStats(), Stats({"slm": 4}, {"slm": 1, "llm": 0}, True), ControlError("a message of type str"),
], ids=lambda message: type(message).__name__)
def test_each_message_crosses_a_socket_pair_unchanged(message):
    worker, pair = pipe()
    worker.send(message)
    received = pair.receive()
    assert type(received) is type(message) and received == message
    worker.close()
    pair.close()


def test_outbox_sends_each_token_once_in_order_with_the_ending_and_the_refusals():
    ours, reader = pipe()
    outbox = Outbox(ours)
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
            out = reader.receive()
            assert isinstance(out, Out)
            messages += 1
            refused += out.refused
            for key, tokens, origins, logprobs, finish_reason, error in out.outputs:
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


class FakeRouter:
    """TokenRouter's surface that the pair's process uses."""

    def __init__(self) -> None:
        self.submitted: list[tuple[list[int], dict]] = []
        self.cancelled: list[str] = []

    def submit(self, prompt: list[int], **keywords) -> RequestHandle:
        if keywords.get("max_tokens", 1) < 1:
            raise RequestError("max_tokens: must be at least 1")
        self.submitted.append((prompt, keywords))
        return RequestHandle(f"r{len(self.submitted)}", None)

    def cancel(self, handle: RequestHandle) -> None:
        self.cancelled.append(handle.rid)

    def kv_blocks_used(self) -> dict[str, int]:
        return {"slm": 3, "llm": 0}

    def held_requests(self) -> dict[str, int]:
        return {"slm": 1, "llm": 0}

    alive = True


def test_the_pair_takes_submits_and_cancels_until_close_and_refuses_a_bad_submit_on_the_outbox():
    worker, pair = pipe()
    router, outbox = FakeRouter(), Outbox(pair)
    outbox.start()
    for message in (Submit(0, [5, 6], {"max_tokens": 2}), Submit(1, [7], {"max_tokens": 0}), Cancel(0),
                    Cancel(9), Close(), Submit(2, [8], {})):  # nothing after Close is taken
        worker.send(message)
    take_requests(router, pair, outbox)
    assert router.submitted == [([5, 6], {"max_tokens": 2})]
    assert router.cancelled == ["r1"]  # the followed request; an unknown key cancels nothing
    out = worker.receive()
    assert out == Out([], [(1, "invalid", "max_tokens: must be at least 1")])
    outbox.stop()


def test_a_pair_that_cannot_start_says_why_in_its_only_message(tmp_path):
    worker, pair = pipe()
    control, _ = pipe()
    serve(str(tmp_path / "missing.yaml"), pair, control)  # returns: nothing to serve
    failed = worker.receive()
    assert isinstance(failed, Failed) and "missing.yaml" in failed.reason

def test_the_pair_ends_on_a_message_of_another_kind_saying_what_came():
    worker, pair = pipe()
    worker.send(("submit", 0, [5, 6], {}))  # an older worker's tuple
    with pytest.raises(UnknownMessage, match="type tuple; it takes Submit, Cancel, Close only"):
        take_requests(FakeRouter(), pair, Outbox(pair))


def test_the_control_thread_answers_stats_and_refuses_another_question_without_leaving_the_worker_waiting():
    worker, pair = pipe()
    thread = threading.Thread(target=answer_control, args=(FakeRouter(), pair), daemon=True)
    thread.start()
    worker.send(AskStats())
    assert worker.receive() == Stats({"slm": 3, "llm": 0}, {"slm": 1, "llm": 0}, True)
    worker.send("stats")  # an older worker's question
    refused = worker.receive()
    assert isinstance(refused, ControlError) and "type str; it takes AskStats only" in refused.reason
    worker.send(AskStats())  # still answering
    assert isinstance(worker.receive(), Stats)
    worker.close()
    thread.join(5)
    assert not thread.is_alive()  # the worker is gone: the thread ends


class FakeProcess:
    pid = 0

    def __init__(self) -> None:
        self.killed = False

    def poll(self) -> int | None:
        return -9 if self.killed else None

    def kill(self) -> None:
        self.killed = True

    def wait(self, timeout: float | None = None) -> int:
        return -9


async def worker_side(control: BlockingChannel, lost: list[str]) -> tuple[PairProcess, BlockingChannel]:
    """A PairProcess over in-process sockets (no process behind it) and the pair's end of its requests socket."""
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_unix_connection(sock=ours)
    pair = PairProcess(None, FakeProcess(), reader, writer, control, Ready(2048, 16, 900), lost.append)
    return pair, BlockingChannel(theirs)


def test_the_worker_reads_outputs_and_takes_another_kind_as_a_lost_pair_naming_it():
    lost: list[str] = []
    control, _ = pipe()

    async def run() -> tuple:
        pair, host = await worker_side(control, lost)
        stream, other = pair.submit([5, 6], {"max_tokens": 4}), pair.submit([7], {})
        assert host.receive() == Submit(stream.key, [5, 6], {"max_tokens": 4})
        host.send(Out([(stream.key, [11, 12], [0, 1], None, None, None)], []))
        await asyncio.wait_for(stream.changed.wait(), 5)
        assert stream.tokens == [11, 12] and not stream.done
        host.send(("out", [], []))  # an older pair's tuple
        await asyncio.wait_for(other.ended.wait(), 5)
        return pair, stream, other

    pair, stream, other = asyncio.run(run())
    assert pair._process.killed  # out of step with this worker: stopped, not left running
    for ended in (stream, other):
        assert ended.refusal[0] == "error" and "type tuple; it takes Out only" in ended.refusal[1]
    assert len(lost) == 1 and "type tuple" in lost[0]


def test_the_worker_raises_a_control_error_and_never_waits_for_a_refused_question():
    ours, theirs = pipe()

    def pair_side() -> None:
        theirs.receive()
        theirs.send(ControlError("the pair's control thread got a message of type str"))
        theirs.receive()
        theirs.send(("stats", {}))  # an answer of another kind

    thread = threading.Thread(target=pair_side, daemon=True)
    thread.start()

    async def run() -> None:
        pair, _ = await worker_side(ours, [])
        with pytest.raises(PairProcessError, match="could not answer: .* type str"):
            pair.kv_blocks_used()
        with pytest.raises(PairProcessError, match="type tuple; it takes Stats, ControlError only"):
            pair.held_requests()

    asyncio.run(run())
    thread.join(5)
