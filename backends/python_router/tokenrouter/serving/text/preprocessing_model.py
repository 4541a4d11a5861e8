"""Triton model `preprocessing`, for clients that tokenize on their own: text -> the entry
subserver's token-level inputs (schema.PREPROCESSING_OUTPUTS, each one batch row).

text_input -> input_ids; stop/bad words -> stop_ids/bad_ids (each sequence followed by -1);
end_id -> the client's end ids, else the model's; embedding_bias_words/weights ->
logit_bias_ids/weights. The fronts do the same in-process with the same code (text_inputs.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..schema import PREPROCESSING_OUTPUTS, flatten_sequences
from .text_inputs import TextInputs
from .tokenizer_stub import TokenizerModel, input_array


class TritonPythonModel(TokenizerModel):
    def initialize(self, args: dict[str, str]) -> None:
        super().initialize(args)
        self.text = TextInputs(self.codec, self.tokenizer_path, self.parameters)

    def respond(self, request: Any) -> dict[str, np.ndarray]:
        text = self.text
        prompt = text.prompt_ids(input_array(request, "text_input"))
        bias = text.logit_bias(input_array(request, "embedding_bias_words"),
                               input_array(request, "embedding_bias_weights"))
        values = {
            "input_ids": prompt,
            "stop_ids": flatten_sequences(text.sequences(input_array(request, "stop_words"), "stop_words")),
            "bad_ids": flatten_sequences(text.sequences(input_array(request, "bad_words"), "bad_words")),
            "end_id": text.end_ids(input_array(request, "end_id")),
            "logit_bias_ids": [token for token, _ in bias],
            "logit_bias_weights": [weight for _, weight in bias],
        }
        return {name: tensor.row(values[name]) for name, tensor in PREPROCESSING_OUTPUTS.items()}
