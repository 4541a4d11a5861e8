"""Fuzz of the Triton glue's bookkeeping: every exception at every step of taking a request in.

The property: whatever raises, and wherever, the request gets exactly one final answer, and its
response sender is never polled for cancellation after that answer (polling a sender whose
request Triton has freed is what crashed tritonserver with SIGSEGV). A fake pb_utils stands in
for Triton here only because the property is about our own bookkeeping; the e2e tests send the
same requests to a real server.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from fake_pb_utils import Faults, FakeRequest, FakeSubserver, error_of, fake_pb, link_call_parameters, peer_sessions

from tokenrouter.protocol import PeerMessage, encode_batch
from tokenrouter.runtime.admission import ServerBusy
from tokenrouter.request_builder import RequestError
from tokenrouter.serving.control import ControlCall
from tokenrouter.serving.subserver.intake import SubserverIntake
from tokenrouter.serving.subserver.peer_sessions import LINK_SECRET_PARAMETER
from tokenrouter.serving.peer_auth import front_request_parameters, peer_parameters
from tokenrouter.serving.subserver.subserver_writer import SubserverWriter

SECRET = "s3cret"
PEERS = {"llm": SECRET}  # the intake's peer: a model of the same server
POLL_S = 0.02  # cancellation polls: often, so a sender polled after its final answer shows quickly
EXCEPTIONS = [RequestError, ServerBusy, ValueError, TypeError, RuntimeError, KeyError, IndexError, AttributeError,
              OverflowError, MemoryError, UnicodeDecodeError, Exception]


def client_request(faults: Faults) -> FakeRequest:
    return FakeRequest({"input_ids": np.array([[5, 6, 7]], dtype=np.int32),
                        "max_tokens": np.array([[4]], dtype=np.int32),
                        "temperature": np.array([[0.0]], dtype=np.float32),
                        "end_id": np.array([[2]], dtype=np.int32),
                        "stop_ids": np.array([[9, -1]], dtype=np.int32),
                        "stream": np.array([[True]])}, {}, faults)


def front_request(faults: Faults) -> FakeRequest:
    """A front's prompt: named by a request key, with the secret; answered at once with an empty
    response (before admission), then as any other."""
    request = client_request(faults)
    request._parameters = front_request_parameters(SECRET, "key-1")
    return request


def peer_request(faults: Faults, secret: str | None = SECRET) -> FakeRequest:
    """A peer message (the first batch of llm's link session) carrying ``secret`` (None: no secret
    parameter at all)."""
    payload = encode_batch([PeerMessage(kind="release", rid="slm-1", sender="llm")])
    parameters = link_call_parameters("llm", SECRET)
    if secret is None:
        parameters.pop(LINK_SECRET_PARAMETER)
    else:
        parameters[LINK_SECRET_PARAMETER] = secret
    return FakeRequest({"peer_message": np.array([[payload]], dtype=np.object_)}, parameters, faults)


def control_request(faults: Faults, secret: str | None = SECRET, keys: tuple[str, ...] = ("key-1",)) -> FakeRequest:
    """A front's cancel: a control call naming its requests' keys."""
    parameters = {} if secret is None else peer_parameters(secret)
    return FakeRequest({"control": ControlCall("cancel", keys=keys).row()}, parameters, faults)


def _run_once(make_request, at: int, kind: type[BaseException]) -> tuple[Faults, FakeRequest, FakeSubserver]:
    faults = Faults(at, kind)
    pb = fake_pb(faults)
    subserver = FakeSubserver(faults)
    writer = SubserverWriter(pb, subserver, cancel_poll_s=POLL_S)
    request = make_request(faults)
    try:
        SubserverIntake(pb, subserver, writer, ["slm", "llm"], SECRET, sessions=peer_sessions(PEERS)).execute([request])
        for sink in subserver.sinks:  # what the subserver owns, it answers later
            sink.on_output([7], [0], "length")
        deadline = time.monotonic() + 2
        while writer._tracked and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(3 * POLL_S)  # three cancellation polls: a sender left tracked would be polled
    finally:
        writer.close()
    assert not writer._tracked, f"sender still tracked after a fault in {faults.fired_in}"
    return faults, request, subserver


@pytest.mark.parametrize("kind", EXCEPTIONS, ids=lambda k: k.__name__)
@pytest.mark.parametrize("make_request", [client_request, front_request, peer_request, control_request],
                         ids=["client", "front", "peer", "control"])
def test_every_fault_at_every_step_answers_once_and_unregisters(make_request, kind) -> None:
    steps = _run_once(make_request, 0, kind)[0].calls  # a clean run: how many steps there are
    assert steps >= 4
    for at in range(1, steps + 1):
        faults, request, _ = _run_once(make_request, at, kind)
        where = faults.fired_in
        assert where is not None
        sender = request.sender
        assert not sender.polled_after_final, f"{kind.__name__} in {where}: sender polled after its final answer"
        if where == "get_response_sender":
            assert not sender.finals  # nothing to answer through; Triton ends the request
            continue
        assert len(sender.finals) == 1, f"{kind.__name__} in {where}: {len(sender.finals)} final answers"
        if sender.failed_flags == 0:  # a front's empty first response failed: the request goes on
            continue
        error = error_of(sender.finals[0])
        assert error is not None, f"{kind.__name__} in {where}: answered without an error"
        if where != "sender.send":  # a failed send is answered by whoever sent: intake or writer
            # unreadable request parameters carry no secret: the peer call is refused as such
            # a full admission queue (ServerBusy) is UNAVAILABLE: the client may retry
            expected = ("INVALID_ARG" if kind is RequestError or where == "parameters"
                        else "UNAVAILABLE" if kind is ServerBusy else "INTERNAL")
            assert error[1] == expected, f"{kind.__name__} in {where}: code {error[1]}"


def test_a_front_request_that_fails_is_answered_as_data() -> None:
    """An error after a front's first response would never reach it through BLS (Triton 2.51), so
    a front's failed request ends with finish_reason "error", its message and code as data; a
    client's gets an error response (a direct client's prompt is refused: the entry is internal).
    Catches an in-band error sent to a client, or an error response sent to a front."""
    internal = "'slm' is internal to this server: send token ids to 'tensorrt_llm'"
    for make_request, in_band, message in ((front_request, True, "bad max_tokens"), (client_request, False, internal)):
        faults = Faults(0, RuntimeError)
        pb = fake_pb(faults)
        subserver = FakeSubserver(faults)
        subserver.submit = lambda *args: (_ for _ in ()).throw(RequestError("bad max_tokens"))
        writer = SubserverWriter(pb, subserver, cancel_poll_s=POLL_S)
        request = make_request(faults)
        try:
            SubserverIntake(pb, subserver, writer, ["slm", "llm"], SECRET, sessions=peer_sessions()).execute([request])
        finally:
            writer.close()
        final, = request.sender.finals
        text, code = error_of(final)
        assert text.startswith(message) and code == "INVALID_ARG"
        assert (final.error is None) == in_band


def test_a_clean_front_request_is_submitted_and_a_direct_clients_is_refused_unsubmitted() -> None:
    _, request, subserver = _run_once(front_request, 0, RuntimeError)
    assert len(subserver.sinks) == 1 and len(request.sender.finals) == 1
    assert error_of(request.sender.finals[0]) is None
    _, request, subserver = _run_once(client_request, 0, RuntimeError)
    assert not subserver.sinks and error_of(request.sender.finals[0])[1] == "INVALID_ARG"


def test_a_peer_message_with_the_secret_is_delivered() -> None:
    _, request, subserver = _run_once(peer_request, 0, RuntimeError)
    assert [m.kind for m in subserver.delivered] == ["release"]
    assert request.sender.finals == [None]  # the acknowledgement: a bare FINAL


@pytest.mark.parametrize("secret", [None, "", "guess", SECRET + "x"], ids=["absent", "empty", "guess", "longer"])
def test_a_peer_message_without_the_secret_is_refused_counted_and_not_delivered(secret: str | None) -> None:
    faults = Faults(0, RuntimeError)
    pb = fake_pb(faults)
    subserver = FakeSubserver(faults)
    refused = []
    writer = SubserverWriter(pb, subserver)
    request = peer_request(faults, secret)
    try:
        SubserverIntake(pb, subserver, writer, ["slm", "llm"], SECRET, on_refused_peer_call=lambda: refused.append(1),
                        sessions=peer_sessions(PEERS)).execute([request])
    finally:
        writer.close()
    assert not subserver.delivered and refused == [1]
    message, code = error_of(request.sender.finals[0])
    assert code == "INVALID_ARG" and "refused" in message


def _intake_calls(*make_requests) -> tuple[FakeSubserver, list[FakeRequest], list[int]]:
    """Each request in turn into one intake; what the subserver saw, the requests, the refusals counted."""
    faults = Faults(0, RuntimeError)
    pb = fake_pb(faults)
    subserver = FakeSubserver(faults)
    writer = SubserverWriter(pb, subserver, cancel_poll_s=POLL_S)
    refused: list[int] = []
    requests = [make(faults) for make in make_requests]
    try:
        intake = SubserverIntake(pb, subserver, writer, ["slm", "llm"], SECRET,
                                 on_refused_peer_call=lambda: refused.append(1), sessions=peer_sessions(PEERS))
        for request in requests:
            intake.execute([request])
    finally:
        writer.close()
    return subserver, requests, refused


def test_a_fronts_cancel_ends_the_request_it_named_by_key_and_is_answered() -> None:
    subserver, (_, cancel), refused = _intake_calls(front_request, control_request)
    (rid, _, _), = subserver.submitted
    assert subserver.cancelled == [rid] and cancel.sender.finals == [None] and not refused


@pytest.mark.parametrize("secret", [None, "guess"], ids=["absent", "guess"])
def test_a_control_call_without_the_secret_is_refused_counted_and_cancels_nothing(secret: str | None) -> None:
    subserver, (_, cancel), refused = _intake_calls(front_request, lambda faults: control_request(faults, secret))
    assert not subserver.cancelled and refused == [1]
    message, code = error_of(cancel.sender.finals[0])
    assert code == "INVALID_ARG" and "'control' is for this server's own models; refused" in message


def test_a_control_call_with_a_command_the_subserver_does_not_take_is_refused_naming_it() -> None:
    def drain(faults: Faults) -> FakeRequest:
        return FakeRequest({"control": ControlCall("drain").row()}, peer_parameters(SECRET), faults)

    subserver, (cancel,), _ = _intake_calls(drain)
    message, code = error_of(cancel.sender.finals[0])
    assert code == "INVALID_ARG" and "command 'drain' is not one of cancel, shutdown" in message


def test_a_peer_batch_is_never_read_as_a_control_call() -> None:
    """The control parameters of old on a peer batch (with the secret) cancel nothing: only the control
    input makes a control call."""
    def old_cancel(faults: Faults) -> FakeRequest:
        request = peer_request(faults)
        request._parameters = {**link_call_parameters("llm", SECRET), "tokenrouter_control": "cancel",
                               "tokenrouter_cancel_keys": "key-1"}
        return request

    subserver, _, _ = _intake_calls(front_request, old_cancel)
    assert not subserver.cancelled and [m.kind for m in subserver.delivered] == ["release"]


def test_a_client_request_to_a_model_that_is_not_the_entry_is_a_clear_invalid_arg() -> None:
    faults = Faults(0, RuntimeError)
    pb = fake_pb(faults)
    subserver = FakeSubserver(faults)
    subserver.name, subserver.is_entry = "llm", False
    writer = SubserverWriter(pb, subserver)
    request = client_request(faults)
    try:
        SubserverIntake(pb, subserver, writer, ["slm", "llm"], SECRET, sessions=peer_sessions()).execute([request])
    finally:
        writer.close()
    message, code = error_of(request.sender.finals[0])
    assert code == "INVALID_ARG" and "not the entry model" in message
    assert not writer._tracked and not subserver.sinks
