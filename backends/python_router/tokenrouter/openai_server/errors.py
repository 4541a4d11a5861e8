"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}`` with the right status.

Bad input is a 400 that names the parameter; an unknown model a 404; a missing or wrong API key a
401; a full admission queue a 429 and a server that cannot take requests now (draining, restarting,
a front not loaded) a 503, both with Retry-After (OpenAI's SDKs retry them); a 500 is only ever
our own fault. A front's errors arrive with their Triton code (triton_stream.py), which says which.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from .triton_stream import TritonCallError

RETRY_AFTER_S = "1"
# Triton's code names -> (HTTP status, OpenAI type, OpenAI code)
BY_TRITON_CODE = {
    "INVALID_ARG": (400, "invalid_request_error", None),
    "NOT_FOUND": (404, "invalid_request_error", "model_not_found"),
    "UNSUPPORTED": (400, "invalid_request_error", None),
    "UNAVAILABLE": (503, "server_error", "server_unavailable"),
    "CANCELLED": (503, "server_error", "server_unavailable"),
}
BUSY = "server busy"  # the entry's admission refusals (runtime/admission.py, roles.py) start so


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"Retry-After": RETRY_AFTER_S} if self.status in (429, 503) else None
        if self.status == 401:
            headers = {"WWW-Authenticate": "Bearer"}
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def from_triton(error: TritonCallError, params: dict[str, str] | None = None) -> OpenAIError:
    """The OpenAI error for a front's error; ``params``: request tensor -> the OpenAI parameter it
    came from, to name the parameter a front's refusal names first."""
    if error.code is None:  # Triton itself refused: the front is not loaded (a drain, a restart)
        return OpenAIError(503, f"the model is not available now, try again: {error.message}", type="server_error",
                           code="server_unavailable")
    if error.code == "UNAVAILABLE" and error.message.startswith(BUSY):
        return OpenAIError(429, error.message, type="server_error", code="server_busy")
    status, kind, code = BY_TRITON_CODE.get(error.code, (500, "server_error", None))
    param = None
    if status == 400 and params:
        first = error.message.split(" ", 1)[0].rstrip(":")
        param = params.get(first)
    return OpenAIError(status, error.message, type=kind, param=param, code=code)
