"""A front's drain state (front/front_model.py, front/front_writer.py), with a fake pb_utils: the
launcher's authenticated ``drain`` call makes the front refuse every new request with the reason it
gave, the requests in flight go on, and the call is answered "still busy" until none is live. A
drain or shutdown without this server start's secret changes nothing. This is how a reload or a
shutdown stops taking requests without unloading a front (which Triton 2.51 cannot finish while
clients keep streams open)."""

from __future__ import annotations

import json
import sys
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from fake_pb_utils import FakeSender, error_of, fake_pb

from tokenrouter.serving.control import ControlCall
from tokenrouter.serving.front.front_writer import FrontWriter
from tokenrouter.serving.peer_auth import peer_parameters

SECRET = "s" * 43
REASON = "the server is restarting to apply a configuration change; try again in a moment"


def request(parameters: dict[str, str], sender: FakeSender, control: ControlCall | None = None) -> SimpleNamespace:
    """A client's request (no inputs), or with ``control`` a control call."""
    tensors = {} if control is None else {"control": SimpleNamespace(as_numpy=control.row)}
    return SimpleNamespace(get_response_sender=lambda: sender, parameters=lambda: json.dumps(parameters),
                           tensors=tensors, inputs=lambda: [], requested_output_names=lambda: [],
                           request_id=lambda: "")


def answer(writer: FrontWriter, sender: FakeSender) -> Any:
    """The one answer ``sender`` got, once the writer sent it."""
    done = threading.Event()
    writer.end_all("flush", 0, SimpleNamespace(send=lambda *a, **k: done.set()))  # queued after it
    assert done.wait(5)
    (response, final), = sender.sent
    assert final
    return response


@pytest.fixture
def front(monkeypatch: pytest.MonkeyPatch):
    pb = fake_pb()
    pb.get_input_tensor_by_name = lambda request, name: request.tensors.get(name)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    monkeypatch.delitem(sys.modules, "tokenrouter.serving.front.front_model", raising=False)
    from tokenrouter.serving.front import front_model

    model = front_model.TritonPythonModel()  # initialize() would load a tokenizer: only the state it sets
    model.secret, model.draining = SECRET, None
    model.text = model.decoupled = model.limits = model.exclude_input = None
    model.writer = FrontWriter(pb, cancel_at_entry=lambda keys: None)
    parsed: list[dict] = []
    monkeypatch.setattr(front_model, "parse_request", lambda inputs, *a, **k: parsed.append(inputs) or [])
    model.parsed = parsed
    yield model
    model.writer.close()


def test_after_a_drain_call_a_new_request_is_refused_with_its_reason_and_never_parsed(front) -> None:
    caller = FakeSender()
    front._take(request(peer_parameters(SECRET), caller, ControlCall("drain", REASON)))
    assert error_of(answer(front.writer, caller)) is None  # nothing live: drained
    client = FakeSender()
    front._take(request({}, client))
    assert error_of(answer(front.writer, client)) == (REASON, "UNAVAILABLE")
    assert front.parsed == []


@pytest.mark.parametrize("command", ["drain", "shutdown", "load"])
def test_a_control_call_without_the_secret_is_refused_and_changes_nothing(front, command: str) -> None:
    caller = FakeSender()
    front._take(request(peer_parameters("a guess"), caller, ControlCall(command, REASON)))
    message, code = error_of(answer(front.writer, caller))
    assert code == "INVALID_ARG" and "refused" in message
    assert front.draining is None
    front._take(request({}, FakeSender()))
    assert len(front.parsed) == 1  # still taken


@pytest.mark.parametrize("command", ["load", "cancel"])
def test_a_control_call_with_a_command_a_front_does_not_take_is_refused_naming_it(front, command: str) -> None:
    caller = FakeSender()
    front._take(request(peer_parameters(SECRET), caller, ControlCall(command, REASON)))
    message, code = error_of(answer(front.writer, caller))
    assert code == "INVALID_ARG" and f"command '{command}' is not one of drain, shutdown" in message
    assert front.draining is None


def test_a_client_request_with_the_control_parameters_of_old_is_a_request_not_a_control_call(front) -> None:
    """Only the control input makes a control call: parameters alone (even with the secret) never do."""
    front._take(request({**peer_parameters(SECRET), "tokenrouter_control": "drain"}, FakeSender()))
    assert front.draining is None and len(front.parsed) == 1


def test_the_drain_call_says_busy_while_a_request_is_live_and_done_once_it_ended() -> None:
    writer = FrontWriter(fake_pb(), cancel_at_entry=lambda keys: None)
    try:
        live = writer.open(FakeSender(), ["key"], None)
        busy = FakeSender()
        writer.answer_drained(busy)
        assert error_of(answer(writer, busy)) == ("1 request(s) in flight", "UNAVAILABLE")
        writer.respond(live, {}, last_of_generation=True)  # its last response: it ends
        done = FakeSender()
        writer.answer_drained(done)
        assert error_of(answer(writer, done)) is None
        assert live.sender.sent[-1][1]  # it finished, with its FINAL, not cut
    finally:
        writer.close()
