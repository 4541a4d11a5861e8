"""A front's BLS calls to the entry subserver (front/entry_call.py), with a fake pb_utils on each
side: the front's calls are answered by the entry's real intake and writer over a scripted
subserver, so what is checked is that the entry reads the front's requests as the front meant
them, and that the front reads the entry's answers (chunks, errors sent as data, error responses)
as the entry meant them. The e2e suites make the same calls on a real server.
"""

from __future__ import annotations

import gc
import time
import weakref
from typing import Any, Callable

import numpy as np
import pytest

from fake_pb_utils import (BlsCall, EntryResponse, FakeRequest, FakeSender, FakeSubserver, TritonError, fake_pb,
                           peer_sessions)

from tokenrouter.protocol import RequestSpec
from tokenrouter.request_builder import RequestError
from tokenrouter.serving.front import entry_call
from tokenrouter.serving.front.entry_call import EntryError, cancel_at_entry, stream_from_entry
from tokenrouter.serving.front.front_request import Generation
from tokenrouter.serving.peer_auth import front_request_parameters
from tokenrouter.serving.schema import CONTROL_INPUT, SUBSERVER_OUTPUTS
from tokenrouter.serving.subserver.intake import SubserverIntake
from tokenrouter.serving.subserver.subserver_writer import SubserverWriter

SECRET = "s3cret"
OUTPUTS = [name for name in SUBSERVER_OUTPUTS if name != "prefix_ids"]
GENERATION = Generation(row=0, sequence=0, prompt_ids=[5, 6, 7], stream=True, echo_prompt=False,
                        spec=RequestSpec(prompt_len=3, max_tokens=4, temperature=0.5, top_k=3, seed=11, end_ids=[2],
                                         stop_sequences=[[9, 10]], min_tokens=1, return_log_probs=True))


class Entry:
    """The entry subserver's process: its own fake pb_utils, the real intake and writer."""

    def __init__(self, on_submit: Callable[..., None] | None = None) -> None:
        self.pb = fake_pb()
        self.subserver = FakeSubserver(on_submit=on_submit)
        self.writer = SubserverWriter(self.pb, self.subserver, cancel_poll_s=0.01)
        self.intake = SubserverIntake(self.pb, self.subserver, self.writer, ["slm", "llm"], SECRET,
                                      sessions=peer_sessions())
        self.answered: list[list[EntryResponse]] = []  # each call's responses

    def answer(self, call: BlsCall) -> list[EntryResponse]:
        """A front's BLS call as a request to this entry; its responses once the last is sent."""
        assert call.model_name == "slm" and call.decoupled
        request = FakeRequest(call.inputs, call.parameters, outputs=call.outputs)
        self.intake.execute([request])
        deadline = time.monotonic() + 5
        while not request.sender.finals:
            assert time.monotonic() < deadline, "the entry never sent a FINAL"
            time.sleep(0.005)
        self.answered.append([as_bls_response(response) for response, _ in request.sender.sent])
        return self.answered[-1]

    def close(self) -> None:
        self.writer.close()


def as_bls_response(response: Any) -> EntryResponse:
    """What the entry sent, as a front's BLS iterator yields it (a bare FINAL: an empty response)."""
    if response is None:
        return EntryResponse()
    return EntryResponse(dict(response.output_tensors or []),
                         None if response.error is None else response.error.message)


@pytest.fixture
def entry_factory():
    entries: list[Entry] = []

    def make(on_submit: Callable[..., None] | None = None) -> Entry:
        entries.append(Entry(on_submit))
        return entries[-1]

    yield make
    for entry in entries:
        entry.close()


def generate(entry: Entry, key: str = "key-1", secret: str = SECRET) -> tuple[Any, list]:
    """The front's side of one generation: (its pb_utils, the chunks it read)."""
    front_pb = fake_pb(answer=entry.answer)
    chunks = list(stream_from_entry(front_pb, "slm", GENERATION.entry_inputs(), OUTPUTS,
                                    front_request_parameters(secret, key)))
    return front_pb, chunks


def test_a_generation_reaches_the_entry_as_the_front_built_it_and_streams_back(entry_factory) -> None:
    """Catches a call that is not decoupled, a request the entry reads differently (prompt, spec,
    stream, outputs), the front's key lost (the entry would not send its early empty response,
    nor errors as data), or the front choking on that empty response."""
    def emit(rid: str, prompt: list[int], spec: RequestSpec, sink: Any) -> None:
        sink.on_output([11, 12], [0, 1], logprobs=[-0.5, -1.0])
        sink.on_output([13], [0], "length", logprobs=[-0.25])

    entry = entry_factory(emit)
    front_pb, chunks = generate(entry)
    [call] = front_pb.bls_calls
    assert call.outputs == OUTPUTS
    [(rid, prompt, spec)] = entry.subserver.submitted
    assert prompt == GENERATION.prompt_ids and spec == GENERATION.spec
    [answered] = entry.answered
    assert not answered[0].output_tensors()  # the keyed request's early empty response, skipped by the front
    assert np.concatenate([c.tokens for c in chunks]).tolist() == [11, 12, 13]
    assert np.concatenate([c.models for c in chunks]).tolist() == [b"slm", b"llm", b"slm"]
    assert np.concatenate([c.logprobs for c in chunks]).tolist() == [-0.5, -1.0, -0.25]
    assert [c.final for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1].finish_reason == "length"


def test_an_error_at_the_entry_reaches_the_front_with_its_code(entry_factory) -> None:
    """Errors after a front's first response travel as data (error_codes.py): catches the front
    reading such an answer as output, or losing its code (INVALID_ARG would read INTERNAL)."""
    def refuse(*args: Any) -> None:
        raise RequestError("min_tokens must be >= 0, got -1")

    entry = entry_factory(refuse)
    with pytest.raises(EntryError, match="min_tokens must be >= 0, got -1") as failed:
        generate(entry)
    assert failed.value.code == TritonError.INVALID_ARG


def test_an_error_response_is_an_internal_entry_error(entry_factory) -> None:
    """A call the entry refuses outright (here: without this server's secret, so not a front's)
    comes back as an error response: catches it read as an empty response and skipped."""
    entry = entry_factory()
    with pytest.raises(EntryError, match="is for this server's own models; refused") as failed:
        generate(entry, secret="guess")
    assert failed.value.code == TritonError.INTERNAL and not entry.subserver.submitted


def test_cancel_at_entry_ends_the_requests_the_front_named(entry_factory) -> None:
    """Catches a control call the entry does not read as a cancel of those keys (wrong input,
    parameters or secret), or one whose refusal the front does not notice."""
    entry = entry_factory()
    for rid, key in (("slm-0", "key-0"), ("slm-1", "key-1"), ("slm-2", "key-2")):
        entry.writer.track(rid, FakeSender(), key=key)
    front_pb = fake_pb(answer=entry.answer)
    cancel_at_entry(front_pb, "slm", SECRET, ["key-0", "key-2", "key-gone"])
    [call] = front_pb.bls_calls
    assert set(call.inputs) == {CONTROL_INPUT} and call.outputs == []
    assert sorted(entry.subserver.cancelled) == ["slm-0", "slm-2"]
    with pytest.raises(EntryError, match="refused"):
        cancel_at_entry(front_pb, "slm", "guess", ["key-1"])
    assert "slm-1" not in entry.subserver.cancelled


class Responses:
    """A BLS response iterator that can be watched for being freed."""

    def __init__(self, responses: list[EntryResponse]) -> None:
        self._responses = responses

    def __iter__(self):
        return iter(self._responses)


def test_a_finished_stream_is_let_go_of_only_after_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton 2.51's stub frees a finished iterator's responses on a thread of its own without the
    GIL when the front held the last reference (entry_call.py): catches a stream, finished or
    failed, whose iterator is dropped as it ends, or one never let go of."""
    monkeypatch.setattr(entry_call._LateRelease, "HOLD_S", 0.2)
    monkeypatch.setattr(entry_call, "_late_release", entry_call._LateRelease())
    final = {name: SUBSERVER_OUTPUTS[name].row(value) for name, value in
             (("output_ids", [4]), ("finish_reason", b"length"), ("large_model_share", 0.0), ("is_final", True))}
    made: list[weakref.ref] = []

    def answer(call: BlsCall) -> Responses:
        error = call.parameters.get("fail")
        responses = Responses([EntryResponse(error=error)] if error else [EntryResponse(), EntryResponse(final)])
        made.append(weakref.ref(responses))
        return responses

    def stream(**parameters: str) -> None:
        list(stream_from_entry(fake_pb(answer=answer), "slm", {}, OUTPUTS, parameters))

    stream()
    with pytest.raises(EntryError):
        stream(fail="boom")
    gc.collect()
    assert made[0]() is not None and made[1]() is not None
    time.sleep(0.25)
    stream()  # the next stream to end lets go of those held long enough
    gc.collect()
    assert made[0]() is None and made[1]() is None and made[2]() is not None
