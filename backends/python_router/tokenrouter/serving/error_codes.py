"""Triton error codes by name, for errors that travel as data from the entry subserver to a front.

Seen on the bundled Triton 2.51: a decoupled BLS response iterator never yields an error response
that follows another response (the front's call then waits forever), and no error code crosses
BLS (every error reads INTERNAL). So the entry ends a front's request that fails with a final data
response instead: finish_reason "error", the message in ``error`` and the code's name in
``error_code`` (subserver/output_chunk.py); the front turns it back into an error response
(front/entry_call.py).
"""

from __future__ import annotations

from .triton_api import PbUtils

# A client that sets this request parameter (true) gets every error of a front as "CODE: message", the
# code's name first: a gRPC stream's error carries the message alone (our OpenAI server maps the code
# to an HTTP status, openai_server/errors.py).
ERROR_CODES_PARAMETER = "tokenrouter_error_codes"

CODE_NAMES = ("INVALID_ARG", "UNAVAILABLE", "INTERNAL", "CANCELLED", "NOT_FOUND", "UNSUPPORTED", "ALREADY_EXISTS",
              "UNKNOWN")


def code_name(pb_utils: PbUtils, code: int | None) -> str:
    """The name of ``code`` (a pb_utils.TritonError code; None: INTERNAL, Triton's default)."""
    return next((name for name in CODE_NAMES if code is not None and getattr(pb_utils.TritonError, name, None) == code),
                "INTERNAL")


def code_of(pb_utils: PbUtils, name: str) -> int:
    return getattr(pb_utils.TritonError, name if name in CODE_NAMES else "INTERNAL")


def coded_message(name: str, message: str) -> str:
    return f"{name}: {message}"


def split_coded(message: str) -> tuple[str | None, str]:
    """(code name, message) of a coded_message; (None, message) for any other."""
    name, sep, rest = message.partition(": ")
    return (name, rest) if sep and name in CODE_NAMES else (None, message)
