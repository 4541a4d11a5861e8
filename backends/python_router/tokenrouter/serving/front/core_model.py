"""``tensorrt_llm``: TensorRT-LLM's core model, token ids in and token ids out, routed like a front.

TensorRT-LLM's token-level tools (``inflight_batcher_llm_client.py``, ``benchmark_core_model.py``,
``end_to_end_test.py``'s hand-driven chain) and custom ensembles call a model of this name with
its inputs (``input_ids``, ``input_lengths``, ``request_output_len``, ...). It is a front in all
but its tensors: the same entry call by decoupled BLS per generation, the same writer (responses,
cancellation), the same fan-out limits and sampling checks; only the request is read by
core_request.py and answered by core_outputs.py, and TensorRT-LLM's stop request (``stop`` true) cancels
the live request of the same request id. Decoupled or unary as ``frontend.decoupled``
(TensorRT-LLM's ``decoupled: ${decoupled_mode}``).

It must exist under this name even where nobody calls it: Triton answers a request for an unknown
model itself, and on a gRPC stream it writes that answer without waiting for a decoupled model's
response being written on the same stream; two writes at once abort tritonserver ("ASSERTION
FAILED: !byte_buffer->Valid()" in grpc's proto_buffer_writer.h, Triton 2.51).
"""

from __future__ import annotations


import numpy as np
import triton_python_backend_utils as pb_utils

from .core_outputs import CoreOutput
from ..schema import OUT_OF_VOCABULARY
from ..text.tokenizer_stub import model_parameters
from ..triton_api import InferenceRequest
from .core_request import parse_core_request
from .front_model import TritonPythonModel as FrontModel
from .front_request import Generation


class TritonPythonModel(FrontModel):
    def initialize(self, args: dict[str, str]) -> None:
        super().initialize(args)
        self.wrap_ids = model_parameters(args).get(OUT_OF_VOCABULARY, "refuse") == "wrap"

    def _take(self, request: InferenceRequest) -> None:
        """TensorRT-LLM's stop request (``stop`` true, the request id of the request to stop) cancels that
        request and is answered with an empty final response; any other request is read as a front reads."""
        stop = pb_utils.get_input_tensor_by_name(request, "stop")
        if stop is None or not stop.as_numpy().any():
            super()._take(request)
            return
        sender = request.get_response_sender()
        if not request.request_id():
            self.writer.reject(sender, "stop: a stop request names the request to stop by its request id; this one "
                                       "has none", pb_utils.TritonError.INVALID_ARG)
            return
        self.writer.stop(request.request_id(), sender)

    def generations(self, inputs: dict[str, np.ndarray]) -> list[Generation]:
        return parse_core_request(inputs, self.text, decoupled=self.decoupled, limits=self.limits,
                                  exclude_input=self.exclude_input, wrap_ids=self.wrap_ids)

    def output(self, generation: Generation) -> CoreOutput:  # type: ignore[override]
        return CoreOutput(generation)
