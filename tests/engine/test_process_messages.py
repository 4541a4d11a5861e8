"""The engine process's messages (engine/process_messages.py) through a real socket pair, with the child's
side (``serve_engine``) on a thread of this process on the simulated engine: no process is started.

Oracle: what crosses the pipe is what the same engine answers when called directly (tokens, logits through
the shared buffer, the free-block count the parent mirrors); a message of another kind is refused by name,
and the child goes on answering."""

from __future__ import annotations

import pickle
import socket
import threading
from multiprocessing import shared_memory
from multiprocessing.connection import Connection
from typing import Iterator

import pytest
import torch

from tokenrouter.config import ModelSpec
from tokenrouter.engine.base import StepRow
from tokenrouter.engine.process_engine import EngineProcess, EngineProcessError, LogitsBuffer, serve_engine
from tokenrouter.engine.process_messages import Call, Close, Raised, Returned, Start
from tokenrouter.engine.simulated import SimulatedEngine
from tokenrouter.pipe_messages import UnknownMessage

pytestmark = pytest.mark.timeout(60)
SPEC = ModelSpec(engine="simulated", profile={"base": "tiny-cpu-small", "time_scale": 0.0}, block_size=4,
                 kv_cache_tokens=64, max_batch_size=2)


class Parent:
    """The parent's end of the pipe, sending and reading messages as EngineProcess does."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def ask(self, message: object) -> object:
        self.conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        return pickle.loads(self.conn.recv_bytes())


@pytest.fixture
def child() -> Iterator[tuple[Parent, threading.Thread]]:
    ours, theirs = socket.socketpair()
    thread = threading.Thread(target=serve_engine, args=(Connection(theirs.detach()),), daemon=True)
    thread.start()
    parent = Parent(Connection(ours.detach()))
    yield parent, thread
    parent.conn.close()
    thread.join(5)


def test_each_message_crosses_the_pipe_and_answers_as_the_engine_itself(child) -> None:
    parent, thread = child
    direct = SimulatedEngine.from_spec("slm", SPEC)
    started = parent.ask(Start("slm", SPEC.model_dump()))
    assert isinstance(started, Returned) and started.free_blocks is None
    facts = started.value
    assert (facts["vocab_size"], facts["num_free_blocks"]) == (direct.vocab_size, direct.num_free_blocks)
    # (not LogitsBuffer.attach: the creating child is this process, registered with its resource tracker)
    logits = LogitsBuffer(shared_memory.SharedMemory(name=facts["logits_buffer"]), facts["vocab_size"])
    try:
        rows = [StepRow(0, [5, 9, 11]), StepRow(1, [7])]
        for seq_id in (0, 1):
            direct.add_sequence(seq_id)
            assert parent.ask(Call("add_sequence", (seq_id,), {})) == Returned(None, direct.num_free_blocks)
        expected = direct.step(rows, top_logits=3)
        stepped = parent.ask(Call("step", (rows,), {"top_logits": 3}))
        assert isinstance(stepped, Returned) and stepped.free_blocks == direct.num_free_blocks
        result, in_buffer = stepped.value
        assert in_buffer and result.logits is None  # the logits went through the shared buffer, not the pipe
        assert result.sampled.tolist() == expected.sampled.tolist()
        assert result.topk_indices.tolist() == expected.topk_indices.tolist()
        torch.testing.assert_close(logits.read(2), expected.logits)

        raised = parent.ask(Call("no_such_method", (), {}))
        assert isinstance(raised, Raised) and isinstance(raised.error, AttributeError)
        assert raised.free_blocks == direct.num_free_blocks
    finally:
        logits.close()
    parent.conn.send_bytes(pickle.dumps(Close()))
    thread.join(5)
    assert not thread.is_alive()  # Close ends the child's loop (and unlinks the buffer)


def test_a_first_message_that_is_not_a_start_is_refused_by_name(child) -> None:
    parent, thread = child
    before = parent.ask(("start", "slm", SPEC.model_dump()))  # the tuples of an older parent
    assert isinstance(before, Raised) and isinstance(before.error, UnknownMessage)
    assert "type tuple; it takes Start only" in str(before.error)
    thread.join(5)
    assert not thread.is_alive()  # never started: nothing to go on with


def test_after_the_start_another_kind_is_answered_as_a_failed_call(child) -> None:
    parent, thread = child
    assert isinstance(parent.ask(Start("slm", SPEC.model_dump())), Returned)
    refused = parent.ask(("call", "sequence_ids", (), {}))
    assert isinstance(refused, Raised) and isinstance(refused.error, UnknownMessage)
    assert "type tuple; it takes Call, Close only" in str(refused.error)
    assert parent.ask(Call("sequence_ids", (), {})) == Returned([], refused.free_blocks)  # still answering
    parent.conn.send_bytes(pickle.dumps(Close()))
    thread.join(5)
    assert not thread.is_alive()


def test_the_parent_takes_an_answer_of_another_kind_as_a_broken_engine() -> None:
    ours, theirs = socket.socketpair()
    engine = object.__new__(EngineProcess)  # its pipe only: no process behind it
    engine.name, engine._conn, engine._free_blocks = "slm", Connection(ours.detach()), 7
    child = Connection(theirs.detach())
    child.send_bytes(pickle.dumps(Returned("facts", 5)))
    assert engine._receive() == "facts" and engine._free_blocks == 5
    child.send_bytes(pickle.dumps(Raised(ValueError("bad row"), 4)))
    with pytest.raises(ValueError, match="bad row"):
        engine._receive()
    assert engine._free_blocks == 4
    child.send_bytes(pickle.dumps(("ok", "facts", 3)))  # an older child's tuple
    with pytest.raises(EngineProcessError, match="type tuple; it takes Returned, Raised only"):
        engine._receive()
    assert engine._free_blocks == 4
    child.close()
    engine._conn.close()
