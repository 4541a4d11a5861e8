"""The part that preprocessing and postprocessing share as Triton Python-backend models.

Each loads the tokenizer named by its ``tokenizer`` parameter and answers every request on its
own: a bad request gets an error response, the others in the same call go on.
Imported only inside Triton's Python stub (it needs triton_python_backend_utils).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from ..runtime.request import RequestError  # invalid request: an INVALID_ARG error response
from ..text import TextCodec
from .repository import repository_path


def input_array(request: Any, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def parse_bool(raw: str) -> bool:
    return raw.strip().lower() in ("true", "1", "yes")


class TokenizerModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        self.parameters = {key: value.get("string_value", "") for key, value in config.get("parameters", {}).items()}
        # args["model_repository"] is this model's folder; parameter paths are relative to its parent
        self.tokenizer_path = repository_path(self.parameters.get("tokenizer", ""), Path(args["model_repository"]).parent)
        if self.tokenizer_path is None:
            raise ValueError(f"{config['name']}: parameter 'tokenizer' is empty; set it to a model folder or .gguf")
        self.codec = TextCodec.from_path(self.tokenizer_path,
                                         chat_template=parse_bool(self.parameters.get("chat_template", "false")))

    def respond(self, request: Any) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def execute(self, requests: list[Any]) -> list[Any]:
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


def error_response(message: str, code: int) -> Any:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))
