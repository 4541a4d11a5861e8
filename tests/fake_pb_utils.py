"""A stand-in for Triton's ``triton_python_backend_utils``, for unit tests of our Triton glue.

Only the calls the glue makes, recording what it sent: the subserver's intake and writer, the
front's writer and its BLS calls to the entry take ``pb_utils`` as an argument, so a test injects
``fake_pb()``. The property such a test checks is our own bookkeeping; the e2e and reliability
suites send the same requests to a real server. ``Faults`` makes every call into Triton a step that
can raise, for the glue's fuzz test (reliability/test_glue_bookkeeping.py). Each fake subclasses the
Protocol it stands in for (tokenrouter/serving/triton_api.py), and the type checker checks this file:
a fake that no longer matches what the glue may call fails the checker (`mypy`, in .ci/run).
"""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace
from typing import Any, Callable, Iterable, Mapping, final

import numpy as np

from tokenrouter.serving import triton_api
from tokenrouter.serving.subserver.peer_sessions import HELLO_PARAMETER, LINK_PARAMETER, PeerSessions, link_parameter
from tokenrouter.serving.subserver.peer_sessions import link_secret_parameters

FINAL = 1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL


class Faults:
    """Counts the glue's calls into Triton and its collaborators; raises ``kind`` at call number
    ``at`` (0: never)."""

    def __init__(self, at: int = 0, kind: type[BaseException] = RuntimeError) -> None:
        self.at, self.kind, self.calls = at, kind, 0
        self.fired_in: str | None = None  # where the fault was raised

    def step(self, where: str) -> None:
        self.calls += 1
        if self.calls == self.at:
            self.fired_in = where
            raise _instance(self.kind)


def _instance(kind: type[BaseException]) -> BaseException:
    if kind is UnicodeDecodeError:
        return UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
    return kind("injected")


class TritonError(triton_api.TritonError):
    """pb_utils.TritonError: the Python backend's codes; INTERNAL when none is given."""

    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self.message, self.code = message, code


CODES = {getattr(TritonError, name): name for name in vars(TritonError) if name.isupper()}


@final  # the checker then reports any member of its Protocol that it lacks
class Tensor(tuple, triton_api.Tensor):
    """pb_utils.Tensor: ``name()`` and ``as_numpy()``; also a (name, array) pair, so a response's
    tensors read as ``dict(response.output_tensors)``."""

    def __new__(cls, name: str, array: np.ndarray) -> "Tensor":
        return super().__new__(cls, (name, array))

    def name(self) -> str:
        return self[0]

    def as_numpy(self) -> np.ndarray:
        return self[1]


@final
class FakeSender(triton_api.ResponseSender):
    """A request's response sender. Like Triton's, it refuses a send after the FINAL (counted in
    ``sends_after_final``); ``log``, when given, gets the sender of every send in order."""

    def __init__(self, faults: Faults | None = None, log: list | None = None) -> None:
        self.faults, self.log, self.lock = faults or Faults(), log, threading.Lock()
        self.sent: list[tuple[Any, bool]] = []  # (response, final)
        self.sends_after_final, self.polled_after_final, self.cancelled = 0, False, False
        self.failed_flags: int | None = None  # the flags of a send that raised

    @property
    def finals(self) -> list[Any]:
        return [response for response, final in self.sent if final]

    def send(self, response: Any = None, flags: int = 0) -> None:
        calls = self.faults.calls
        try:
            self.faults.step("sender.send")
        except BaseException:
            if self.faults.calls == self.faults.at == calls + 1:
                self.failed_flags = flags
            raise
        with self.lock:
            if self.finals:
                self.sends_after_final += 1
                raise RuntimeError("Unable to send response. Response sender has been closed.")
            self.sent.append((response, bool(flags & FINAL)))
            if self.log is not None:
                self.log.append(self)

    def is_cancelled(self) -> bool:
        with self.lock:
            self.polled_after_final |= bool(self.finals)
            return self.cancelled


@final
class FakeTensor(triton_api.Tensor):
    def __init__(self, name: str, array: np.ndarray, faults: Faults) -> None:
        self._name, self.array, self.faults = name, array, faults

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        self.faults.step("as_numpy")
        return self.array


@final
class FakeRequest(triton_api.InferenceRequest):
    """A client's (or a peer's) request to a model: inputs by name, parameters, a response sender."""

    def __init__(self, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, str],
                 faults: Faults | None = None, outputs: Iterable[str] = (), request_id: str = "") -> None:
        self.faults, self._request_id = faults or Faults(), request_id
        self.inputs_by_name = {name: FakeTensor(name, array, self.faults) for name, array in inputs.items()}
        self.sender = FakeSender(self.faults)
        self._parameters, self._outputs = dict(parameters), list(outputs)

    def get_response_sender(self) -> FakeSender:
        self.faults.step("get_response_sender")
        return self.sender

    def parameters(self) -> str:
        self.faults.step("parameters")
        return json.dumps(self._parameters)

    def inputs(self) -> list[FakeTensor]:
        self.faults.step("inputs")
        return list(self.inputs_by_name.values())

    def request_id(self) -> str:
        return self._request_id

    def requested_output_names(self) -> list[str]:
        self.faults.step("requested_output_names")
        return list(self._outputs)


class FakeSubserver:
    """The subserver behind an intake: records submissions (their sinks), messages and cancels;
    ``on_submit(rid, prompt, spec, sink)``, when given, answers a submission at once."""

    name, entry, is_entry, index = "slm", "slm", True, 0
    engine = SimpleNamespace(eos_token_ids={2}, num_used_blocks=0, vocab_size=1000)

    def __init__(self, faults: Faults | None = None, on_submit: Callable[..., None] | None = None) -> None:
        self.faults, self.on_submit = faults or Faults(), on_submit
        self.submitted: list[tuple[str, list[int], Any]] = []  # (rid, prompt, spec)
        self.sinks: list[Any] = []
        self.delivered: list[Any] = []
        self.cancelled: list[str] = []

    def submit(self, rid: str, prompt: list[int], spec: Any, sink: Any) -> None:
        self.faults.step("subserver.submit")
        self.submitted.append((rid, prompt, spec))
        self.sinks.append(sink)
        if self.on_submit is not None:
            self.on_submit(rid, prompt, spec, sink)

    def deliver(self, message: Any) -> None:
        self.faults.step("subserver.deliver")
        self.delivered.append(message)

    def cancel(self, rid: str) -> None:
        self.cancelled.append(rid)


def peer_sessions(secrets: Mapping[str, str] | None = None) -> PeerSessions:
    """An intake's receiving end of its peers' links, with a session of each sender in ``secrets``
    (by that secret, epoch "e") open: its batch 1 is the next (``link_call_parameters``). None: no peers."""
    sessions = PeerSessions({}, secrets or {}, here="'slm'", on_session_lost=lambda sender, why: None)
    for sender, secret in (secrets or {}).items():
        sessions.take({**link_call_parameters(sender, secret, 0), HELLO_PARAMETER: "{}"}, list)
    return sessions


def link_call_parameters(sender: str, secret: str, number: int = 1) -> dict[str, str]:
    """The parameters of link call ``number`` of ``sender``'s session "e", with ``secret``."""
    return {**link_secret_parameters(secret), LINK_PARAMETER: link_parameter(sender, "e", number)}


@final
class BlsError(triton_api.BlsError):
    def __init__(self, message: str) -> None:
        self._message = message

    def message(self) -> str:
        return self._message


@final
class EntryResponse(triton_api.BlsResponse):
    """One response of a BLS stream (what ``InferenceRequest.exec`` yields)."""

    def __init__(self, outputs: Mapping[str, np.ndarray] | None = None, error: str | None = None) -> None:
        self._outputs, self._error = dict(outputs or {}), error

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> BlsError:
        return BlsError(self._error or "")

    def output_tensors(self) -> list[Tensor]:
        return [Tensor(name, array) for name, array in self._outputs.items()]


@final
class BlsCall(triton_api.BlsRequest):
    """A BLS request a model built (pb_utils.InferenceRequest); ``exec`` answers it with what
    ``answer(call)`` returns, and records the call in ``calls``."""

    def __init__(self, calls: list, answer: Callable[["BlsCall"], Iterable[EntryResponse]], *, model_name: str,
                 inputs: list[triton_api.Tensor], requested_output_names: list[str],
                 parameters: Mapping[str, str]) -> None:
        self.model_name, self.outputs, self.parameters = model_name, list(requested_output_names), dict(parameters)
        self.inputs = {tensor.name(): tensor.as_numpy() for tensor in inputs}
        self._calls, self._answer = calls, answer
        self.decoupled: bool | None = None  # how it was executed
        calls.append(self)

    def exec(self, decoupled: bool = False) -> Iterable[EntryResponse]:
        self.decoupled = decoupled
        return self._answer(self)


@final
class FakeResponse(triton_api.InferenceResponse):
    """pb_utils.InferenceResponse: what a model answers, as it was built."""

    def __init__(self, output_tensors: list[triton_api.Tensor] | None = None,
                 error: triton_api.TritonError | None = None) -> None:
        self.output_tensors, self.error = output_tensors, error


@final
class FakePbUtils(triton_api.PbUtils):
    """The module as the glue sees it. ``answer``: how BLS calls are answered; they are recorded in
    ``bls_calls``."""

    TRITONSERVER_RESPONSE_COMPLETE_FINAL = FINAL
    TritonError = TritonError
    Tensor = Tensor
    InferenceResponse = FakeResponse

    def __init__(self, faults: Faults | None = None,
                 answer: Callable[[BlsCall], Iterable[EntryResponse]] = lambda call: iter(())) -> None:
        self.faults, self.answer = faults or Faults(), answer
        self.bls_calls: list[BlsCall] = []

    def get_input_tensor_by_name(self, request: triton_api.InferenceRequest, name: str, /) -> FakeTensor | None:
        assert isinstance(request, FakeRequest), "the glue reads only the requests Triton (here: the test) gave it"
        self.faults.step(f"get_input_tensor_by_name({name})")
        return request.inputs_by_name.get(name)

    def InferenceRequest(self, *, model_name: str, inputs: list[triton_api.Tensor], requested_output_names: list[str],
                         parameters: Mapping[str, str]) -> BlsCall:
        return BlsCall(self.bls_calls, self.answer, model_name=model_name, inputs=inputs,
                       requested_output_names=requested_output_names, parameters=parameters)


def fake_pb(faults: Faults | None = None,
            answer: Callable[[BlsCall], Iterable[EntryResponse]] = lambda call: iter(())) -> FakePbUtils:
    """The module as the glue sees it (``FakePbUtils``)."""
    return FakePbUtils(faults, answer)


def error_of(response: Any) -> tuple[str, str] | None:
    """(message, code name) of an error answer: an error response, or to a front one sent as data
    (serving/error_codes.py); None for an answer without an error."""
    if response is None:
        return None
    if response.error is not None:
        return response.error.message, CODES[response.error.code]
    tensors = dict(response.output_tensors or [])
    if "error" not in tensors:
        return None
    return tensors["error"].reshape(-1)[0].decode(), tensors["error_code"].reshape(-1)[0].decode()
