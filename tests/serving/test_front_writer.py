"""The front's writer (front/front_writer.py), with a fake pb_utils: every request gets exactly one
FINAL, on its last response; errors end a request once and cancel its other generations at the
entry; a client that cancels has its generations cancelled at the entry; and on the launcher's
control call every live request ends with an error that says why (and to retry), later output of
those requests goes nowhere, and the control call is answered after them. That last is how a client
learns that the entry's stub died: the entry itself can no longer answer."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Callable

import numpy as np

from fake_pb_utils import FakeSender, Faults, TritonError, error_of, fake_pb

from tokenrouter.serving.front.front_writer import FrontWriter

POLL_S = 0.01


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def text(value: str) -> dict[str, np.ndarray]:
    return {"text_output": np.array([value.encode()], dtype=object), "output_ids": np.array([[1, 2]], dtype=np.int32)}


def texts(sender: FakeSender) -> list[tuple[str, bool]]:
    """(text_output, final) of each response sent."""
    return [(dict(response.output_tensors)["text_output"][0].decode(), final) for response, final in sender.sent]


class EntryCancels:
    """The writer's ``cancel_at_entry``: the key lists it was called with."""

    def __init__(self, fails: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.fails = fails

    def __call__(self, keys: list[str]) -> None:
        self.calls.append(list(keys))
        if self.fails:
            raise RuntimeError("the entry is gone")


def test_the_final_flag_rides_on_the_last_response_of_the_last_generation() -> None:
    """Two generations interleaved: the FINAL goes with the second generation to end, not the first;
    only the outputs asked for are sent. Catches FINAL on each generation's last response (Triton
    would then drop the other generation's responses) and outputs sent unasked."""
    writer = FrontWriter(fake_pb(), EntryCancels())
    sender = FakeSender()
    try:
        client = writer.open(sender, ["k0", "k1"], ["text_output"])
        writer.respond(client, text("a0"), last_of_generation=False)
        writer.respond(client, text("b0"), last_of_generation=False)
        writer.respond(client, text("a1"), last_of_generation=True)
        writer.respond(client, text("b1"), last_of_generation=True)
        wait_for(lambda: sender.finals)
    finally:
        writer.close()
    assert texts(sender) == [("a0", False), ("b0", False), ("a1", False), ("b1", True)]
    assert all(set(dict(response.output_tensors)) == {"text_output"} for response, _ in sender.sent)
    assert sender.sends_after_final == 0


def test_a_failed_generation_ends_the_request_once_and_cancels_the_others_at_the_entry() -> None:
    """Catches a second FINAL for a failed request (its other generation's later output, or a second
    error), and the other generations left running at the entry."""
    cancels = EntryCancels()
    writer = FrontWriter(fake_pb(), cancels)
    two, one = FakeSender(), FakeSender()
    try:
        client = writer.open(two, ["k0", "k1"], None)
        writer.respond(client, text("a0"), last_of_generation=False)
        writer.fail(client, "'slm' ended the stream without a final response", TritonError.INTERNAL)
        writer.fail(client, "again", TritonError.INTERNAL)
        writer.respond(client, text("b0"), last_of_generation=True)
        alone = writer.open(one, ["k2"], None)
        writer.fail(alone, "bad stop_ids", TritonError.INVALID_ARG)
        wait_for(lambda: one.finals)
    finally:
        writer.close()
    assert [final for _, final in two.sent] == [False, True]
    assert error_of(two.finals[0]) == ("'slm' ended the stream without a final response", "INTERNAL")
    assert [error_of(response) for response, _ in one.sent] == [("bad stop_ids", "INVALID_ARG")]
    assert cancels.calls == [["k0", "k1"]]  # a request of one generation: its only one has ended already
    assert two.sends_after_final == one.sends_after_final == 0


def test_a_request_that_never_started_is_answered_with_its_error_coded_when_asked() -> None:
    """Catches the code left out of a message for a client that asked for codes (our OpenAI server
    maps them to HTTP statuses), or put into one for a client that did not."""
    writer = FrontWriter(fake_pb(), EntryCancels())
    plain, coded = FakeSender(), FakeSender()
    try:
        writer.reject(plain, "text_input is missing", TritonError.INVALID_ARG)
        writer.reject(coded, "text_input is missing", TritonError.INVALID_ARG, code_in_message=True)
        wait_for(lambda: plain.finals and coded.finals)
    finally:
        writer.close()
    assert [error_of(response) for response, _ in plain.sent] == [("text_input is missing", "INVALID_ARG")]
    assert [error_of(response) for response, _ in coded.sent] == [("INVALID_ARG: text_input is missing", "INVALID_ARG")]


def test_a_client_that_cancels_has_its_generations_cancelled_at_the_entry_once() -> None:
    """The cancelled request's keys go to the entry once, the other request's never; the cancelled
    generations' last responses ('cancelled' from the entry) still reach the client with the FINAL,
    and its sender is not polled after it. Catches cancellation never passed on, passed on at every
    poll, or a request dropped before its FINAL."""
    cancels = EntryCancels()
    writer = FrontWriter(fake_pb(), cancels, cancel_poll_s=POLL_S)
    going, staying = FakeSender(), FakeSender()
    try:
        leaving = writer.open(going, ["k0", "k1"], None)
        writer.open(staying, ["k2"], None)
        going.cancelled = True
        wait_for(lambda: cancels.calls)
        time.sleep(10 * POLL_S)  # more polls: the keys must not be sent again
        writer.respond(leaving, text("cancelled"), last_of_generation=True)
        writer.respond(leaving, text("cancelled"), last_of_generation=True)
        wait_for(lambda: going.finals)
        time.sleep(5 * POLL_S)
    finally:
        writer.close()
    assert cancels.calls == [["k0", "k1"]]
    assert texts(going) == [("cancelled", False), ("cancelled", True)]
    assert not going.polled_after_final and not staying.sent


def test_a_cancel_that_fails_at_the_entry_leaves_the_writer_running() -> None:
    writer = FrontWriter(fake_pb(), EntryCancels(fails=True), cancel_poll_s=POLL_S)
    gone, later = FakeSender(), FakeSender()
    try:
        gone.cancelled = True
        writer.open(gone, ["k0"], None)
        time.sleep(5 * POLL_S)
        client = writer.open(later, ["k1"], None)
        writer.respond(client, text("ok"), last_of_generation=True)
        wait_for(lambda: later.finals)
    finally:
        writer.close()
    assert texts(later) == [("ok", True)]


def test_a_final_response_that_cannot_be_sent_is_replaced_by_an_error_final() -> None:
    """Triton frees a request only on a FINAL: catches a failed last send left without one (the
    request would never be freed)."""
    writer = FrontWriter(fake_pb(), EntryCancels())
    sender = FakeSender(Faults(at=1))  # its first send raises
    try:
        client = writer.open(sender, ["k0"], None)
        writer.respond(client, text("all"), last_of_generation=True)
        wait_for(lambda: sender.finals)
    finally:
        writer.close()
    [(response, final)] = sender.sent
    message, code = error_of(response)
    assert final and code == "INTERNAL" and message == "the response could not be sent: RuntimeError: injected"


def test_end_all_fails_every_live_request_once_then_answers_the_caller() -> None:
    log: list[FakeSender] = []
    writer = FrontWriter(fake_pb(), cancel_at_entry=lambda keys: None)
    try:
        clients = [writer.open(FakeSender(log=log), [f"key-{i}"], None) for i in range(3)]
        writer.respond(clients[0], text("a"), last_of_generation=False)
        caller = FakeSender(log=log)
        reason = "the Python stub of model slm died; the server is restarting, try again"
        writer.end_all(reason, TritonError.UNAVAILABLE, caller)
        writer.respond(clients[1], text("late"), last_of_generation=True)
        done = threading.Event()
        writer.end_all("again", TritonError.UNAVAILABLE, SimpleNamespace(send=lambda *a, **k: done.set()))
        assert done.wait(5)
    finally:
        writer.close()
    for client in clients:
        (*before, (last, final)) = client.sender.sent
        assert final and error_of(last) == (reason, "UNAVAILABLE")
        assert all(response.error is None for response, _ in before)  # the late output went nowhere
        assert client.sender.sends_after_final == 0
    assert [len(c.sender.sent) for c in clients] == [2, 1, 1]
    assert caller.sent == [(caller.sent[0][0], True)] and caller.sent[0][0].error is None
    assert log.index(caller) > max(log.index(c.sender) for c in clients)  # answered after the clients


def test_a_stop_request_cancels_the_requests_of_its_request_id_and_is_answered() -> None:
    """TensorRT-LLM's stop request (tensorrt_llm, ``stop`` true) names the request to stop by its request
    id: that one's generations are cancelled at the entry, no other's, and the stop request gets one empty
    FINAL; the stopped request then ends as usual (its generations' last output carries the FINAL)."""
    entry = EntryCancels()
    writer = FrontWriter(fake_pb(), entry, cancel_poll_s=POLL_S)
    stopped, other, caller = FakeSender(), FakeSender(), FakeSender()
    try:
        client = writer.open(stopped, ["k0", "k1"], None, request_id="7")
        writer.open(other, ["k2"], None, request_id="8")
        writer.stop("7", caller)
        wait_for(lambda: caller.sent)
        assert entry.calls == [["k0", "k1"]]
        assert [(list(dict(response.output_tensors)), final) for response, final in caller.sent] == [([], True)]
        writer.respond(client, text("a"), last_of_generation=True)
        writer.respond(client, text("b"), last_of_generation=True)
        wait_for(lambda: len(stopped.sent) == 2)
        assert texts(stopped) == [("a", False), ("b", True)] and not other.sent
    finally:
        writer.close()
