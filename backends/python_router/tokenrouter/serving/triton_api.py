"""The part of Triton's Python-backend API that our glue uses, as Protocols.

Triton hands each model its ``triton_python_backend_utils`` module (``pb_utils``) and request objects;
neither exists outside a Triton stub, so the glue takes ``pb_utils`` as an argument and these
Protocols say what it may call. tests/fake_pb_utils.py implements the same Protocols, and the type
checker holds it to them (``fake_pb`` is declared to return a ``PbUtils``), so a unit test's fake
cannot drift from what the glue calls. Only what the glue calls is here, not the whole module.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import numpy as np


class Tensor(Protocol):
    """pb_utils.Tensor: a named array."""

    def name(self) -> str: ...

    def as_numpy(self) -> np.ndarray: ...


class TritonError(Protocol):
    """pb_utils.TritonError as the glue builds it, to hand to an ``InferenceResponse``."""


class BlsError(Protocol):
    """The error of a BLS response: its message (no code crosses BLS: serving/error_codes.py)."""

    def message(self) -> str: ...


class ErrorType(Protocol):
    """The TritonError class: made from a message and a code; its codes as class attributes."""

    UNKNOWN: int
    INTERNAL: int
    NOT_FOUND: int
    INVALID_ARG: int
    UNAVAILABLE: int
    UNSUPPORTED: int
    ALREADY_EXISTS: int
    CANCELLED: int

    def __call__(self, message: str, code: int = ..., /) -> TritonError: ...


class InferenceResponse(Protocol):
    """A response: the output tensors, or an error. Our glue only builds them and reads those a BLS
    call returns (``BlsResponse``)."""


class BlsResponse(Protocol):
    """One response of a BLS call (what ``BlsRequest.exec`` returns or yields)."""

    def has_error(self) -> bool: ...

    def error(self) -> BlsError: ...

    def output_tensors(self) -> Sequence[Tensor]: ...


class BlsRequest(Protocol):
    """A request a model makes to another model of the same server (pb_utils.InferenceRequest)."""

    def exec(self, decoupled: bool = ...) -> Iterable[BlsResponse]: ...


class ResponseSender(Protocol):
    """A request's response sender (decoupled models answer through it, any number of times)."""

    def send(self, response: InferenceResponse | None = ..., flags: int = ...) -> None: ...

    def is_cancelled(self) -> bool: ...


class InferenceRequest(Protocol):
    """A request Triton hands a model's ``execute``; its inputs are read with
    ``PbUtils.get_input_tensor_by_name``."""

    def get_response_sender(self) -> ResponseSender: ...

    def inputs(self) -> Sequence[Tensor]: ...

    def request_id(self) -> str: ...

    def parameters(self) -> str: ...  # JSON

    def requested_output_names(self) -> list[str]: ...


# PbUtils's members bear these Protocols' names, which would shadow them in its annotations
_Tensor = Tensor
_TritonError = TritonError
_InferenceRequest = InferenceRequest
_InferenceResponse = InferenceResponse


class PbUtils(Protocol):
    """The ``triton_python_backend_utils`` module as the glue uses it."""

    @property
    def TRITONSERVER_RESPONSE_COMPLETE_FINAL(self) -> int: ...

    @property
    def TritonError(self) -> ErrorType: ...

    def Tensor(self, name: str, array: np.ndarray, /) -> _Tensor: ...

    def InferenceResponse(self, output_tensors: list[_Tensor] | None = ...,
                          error: _TritonError | None = ...) -> _InferenceResponse: ...

    def InferenceRequest(self, *, model_name: str, inputs: list[_Tensor], requested_output_names: list[str],
                         parameters: Mapping[str, str]) -> BlsRequest: ...

    def get_input_tensor_by_name(self, request: _InferenceRequest, name: str, /) -> _Tensor | None: ...
