"""``tensorrt_llm``: TensorRT-LLM's core model name, held by a model that refuses every request clearly.

TensorRT-LLM's token-level tools (``benchmark_core_model.py``, ``inflight_batcher_llm_client.py``)
call a model of that name with token ids (``input_ids``, ``request_output_len``, ...); this server
routes between subservers instead and has no such model. Left unknown, the name takes the server
down: Triton answers a request for an unknown model itself, and on a gRPC stream it writes that
answer (as it writes any non-decoupled model's response) without waiting for a decoupled model's
response being written on the same stream; two writes at once abort tritonserver ("ASSERTION
FAILED: !byte_buffer->Valid()" in grpc's proto_buffer_writer.h; Triton 2.51's
``InferHandler::...::WriteResponseIfReady`` never checks ``ongoing_write_``, nor does its main
branch). ``benchmark_core_model.py --decoupled --tensorrt-llm-model-name slm`` sends to
``tensorrt_llm`` and ``slm`` in turn on one stream and aborted the server in 3 of 6 runs. This
model is decoupled, so its refusals take the decoupled path, which Triton writes one at a time.
It declares the core model's inputs that those tools send, so the refusal is ours, not Triton's
"unexpected inference input".
"""

from __future__ import annotations

import json
import logging
from typing import Any

import triton_python_backend_utils as pb_utils

log = logging.getLogger(__name__)


def refusal(entry: str, fronts: list[str]) -> str:
    return (f"'tensorrt_llm' is TensorRT-LLM's core model (token ids in, token ids out); this server routes "
            f"tokens between subservers and does not serve it: send text to a front ({', '.join(fronts)}), or "
            f"token ids to the entry subserver '{entry}' (input_ids, max_tokens, stream; docs/compatibility.md)")


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        parameters = {key: value.get("string_value", "") for key, value in
                      json.loads(args["model_config"]).get("parameters", {}).items()}
        self.message = refusal(parameters.get("entry", ""), json.loads(parameters.get("fronts") or "[]"))

    def execute(self, requests: list) -> None:
        for request in requests:
            _refuse(request, self.message)
        return None

    def finalize(self) -> None:
        pass


def _refuse(request: Any, message: str) -> None:
    """One error response with the FINAL flag (a failure here costs this request only)."""
    try:
        request.get_response_sender().send(
            pb_utils.InferenceResponse(output_tensors=[],
                                       error=pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG)),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    except Exception:  # noqa: BLE001 - the client is gone; nothing else to answer
        log.debug("a refusal could not be sent", exc_info=True)
