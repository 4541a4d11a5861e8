"""The front's writer ends every live request on the launcher's control call: each client gets one
error FINAL that says why (and to retry), later output of those requests goes nowhere, and the control
call is answered after them. This is how a client learns that the entry's stub died: the entry
itself can no longer answer."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import numpy as np

from tokenrouter.serving.front.front_writer import FrontWriter

FINAL = 1


class Sender:
    def __init__(self, log: list) -> None:
        self.log, self.sent = log, []

    def send(self, response: Any = None, flags: int = 0) -> None:
        assert not any(final for _, final in self.sent), "a send after the FINAL"
        self.sent.append((response, bool(flags & FINAL)))
        self.log.append(self)

    def is_cancelled(self) -> bool:
        return False


def fake_pb() -> SimpleNamespace:
    class TritonError:
        UNAVAILABLE, INVALID_ARG = 14, 3

        def __init__(self, message: str, code: int = 13) -> None:
            self.message, self.code = message, code

    return SimpleNamespace(TRITONSERVER_RESPONSE_COMPLETE_FINAL=FINAL, TritonError=TritonError,
                           InferenceResponse=lambda output_tensors=None, error=None: SimpleNamespace(
                               error=error, output_tensors=output_tensors),
                           Tensor=lambda name, array: (name, array))


def test_end_all_fails_every_live_request_once_then_answers_the_caller() -> None:
    pb, log = fake_pb(), []
    writer = FrontWriter(pb, cancel_at_entry=lambda keys: None)
    try:
        clients = [writer.open(Sender(log), [f"key-{i}"], None) for i in range(3)]
        writer.respond(clients[0], {"text_output": np.array([b"a"], dtype=object)}, last_of_generation=False)
        caller = Sender(log)
        reason = "the Python stub of model slm died; the server is restarting, try again"
        writer.end_all(reason, pb.TritonError.UNAVAILABLE, caller)
        writer.respond(clients[1], {"text_output": np.array([b"late"], dtype=object)}, last_of_generation=True)
        done = threading.Event()
        writer.end_all("again", pb.TritonError.UNAVAILABLE, SimpleNamespace(send=lambda *a, **k: done.set()))
        assert done.wait(5)
    finally:
        writer.close()
    for client in clients:
        (*before, (last, final)) = client.sender.sent
        assert final and last.error.message == reason and last.error.code == pb.TritonError.UNAVAILABLE
        assert all(response.error is None for response, _ in before)  # the late output went nowhere
    assert [len(c.sender.sent) for c in clients] == [2, 1, 1]
    assert caller.sent == [(caller.sent[0][0], True)] and caller.sent[0][0].error is None
    assert log.index(caller) > max(log.index(c.sender) for c in clients)  # answered after the clients
