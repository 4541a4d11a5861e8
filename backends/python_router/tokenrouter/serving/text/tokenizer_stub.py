"""What the Python-backend models of the repository share: preprocessing, postprocessing, the fronts.

Each loads the tokenizer named by its ``tokenizer`` parameter. Preprocessing and postprocessing
answer every request on their own: a bad request gets an error response, the others in the same
call go on. Imported only inside Triton's Python stub (it needs triton_python_backend_utils).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from ...request_builder import RequestError  # invalid request: an INVALID_ARG error response
from ...text import TextCodec
from ..repository import repository_path
from ..triton_api import InferenceRequest, InferenceResponse


def input_array(request: InferenceRequest, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def parse_bool(raw: str) -> bool:
    return raw.strip().lower() in ("true", "1", "yes")


def model_parameters(args: dict[str, str]) -> dict[str, str]:
    config = json.loads(args["model_config"])
    return {key: value.get("string_value", "") for key, value in config.get("parameters", {}).items()}


def load_codec(args: dict[str, str], parameters: dict[str, str]) -> tuple[TextCodec, str]:
    """The model's tokenizer (parameter ``tokenizer``, relative to the repository folder; the chat
    template when ``chat_template`` is true) and the tokenizer's path."""
    # args["model_repository"] is this model's folder; parameter paths are relative to its parent
    path = repository_path(parameters.get("tokenizer", ""), Path(args["model_repository"]).parent)
    if path is None:
        raise ValueError(f"{args['model_name']}: parameter 'tokenizer' is empty; set it to a model folder or .gguf")
    return TextCodec.from_path(path, chat_template=parse_bool(parameters.get("chat_template", "false"))), path


class TokenizerModel:
    def initialize(self, args: dict[str, str]) -> None:
        self.parameters = model_parameters(args)
        self.codec, self.tokenizer_path = load_codec(args, self.parameters)

    def respond(self, request: InferenceRequest) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def execute(self, requests: list[InferenceRequest]) -> list[InferenceResponse]:
        responses = []
        for request in requests:
            try:
                outputs = self.respond(request)
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(k, v) for k, v in outputs.items()]))
            except RequestError as err:
                responses.append(error_response(str(err), pb_utils.TritonError.INVALID_ARG))
            except Exception as err:  # noqa: BLE001 - one failing request must not fail its neighbours
                responses.append(error_response(f"{type(err).__name__}: {err}", pb_utils.TritonError.INTERNAL))
        return responses


def error_response(message: str, code: int) -> InferenceResponse:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))
