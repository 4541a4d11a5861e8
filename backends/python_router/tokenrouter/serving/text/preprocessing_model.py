"""Triton model `preprocessing`: TensorRT-LLM's, for pipelines that compose their own (its names,
dtypes and dims at tensorrtllm_backend c2e65b88; schema.PREPROCESSING_INPUTS / _OUTPUTS).

Per batch row: ``QUERY`` -> ``INPUT_ID`` (padded to the longest row with the pad id) and
``REQUEST_INPUT_LEN``; ``STOP_WORDS_DICT`` / ``BAD_WORDS_DICT`` -> ``STOP_WORDS_IDS`` / ``BAD_WORDS_IDS``
in TensorRT-LLM's [2, n] word-list layout; ``EMBEDDING_BIAS_WORDS`` with ``_WEIGHTS`` -> ``EMBEDDING_BIAS``,
one value per vocabulary entry ([rows, 0] without words); ``END_ID`` / ``PAD_ID`` (else the tokenizer's) ->
``OUT_END_ID`` / ``OUT_PAD_ID``; ``REQUEST_OUTPUT_LEN`` passed on; ``DECODER_INPUT_ID`` the pad id (the
models are decoder-only). Text is read as the fronts read it (text_inputs.py: the same byte and word
caps, the same chat template setting), so ``preprocessing`` -> ``tensorrt_llm`` sends a front's token ids.
"""

from __future__ import annotations

import numpy as np

from ...request_builder import RequestError
from ..schema import PREPROCESSING_OUTPUTS, word_list_rows
from ..triton_api import InferenceRequest
from .text_inputs import TextInputs
from .tokenizer_stub import TokenizerModel, input_array

# TensorRT-LLM's inputs that have no meaning here: why, in the client's terms
REFUSED = {
    "DECODER_QUERY": "encoder-decoder models only; the routed models are decoder-only",
    "IMAGE_BYTES": "multimodal input is not supported; the routed models take text",
    "IMAGE_URL": "multimodal input is not supported; the routed models take text",
    "VIDEO_BYTES": "multimodal input is not supported; the routed models take text",
    "PROMPT_TABLE_EXTRA_ID": "prompt tuning is not supported; every model of a route reads the same token ids",
}


class TritonPythonModel(TokenizerModel):
    def initialize(self, args: dict[str, str]) -> None:
        super().initialize(args)
        self.text = TextInputs(self.codec, self.tokenizer_path, self.parameters)
        tokenizer = self.codec.tokenizer
        eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else next(iter(self.text.default_end_ids), 0)
        self.end_id = int(eos)
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos)

    def respond(self, request: InferenceRequest) -> dict[str, np.ndarray]:
        for name in REFUSED:
            if input_array(request, name) is not None:
                raise RequestError(f"{name}: {REFUSED[name]}")
        arrays: dict[str, np.ndarray] = {}
        for name in ("QUERY", "REQUEST_OUTPUT_LEN"):
            array = input_array(request, name)
            if array is None:
                raise RequestError(f"{name} is missing (TensorRT-LLM's preprocessing requires it)")
            arrays[name] = array
        rows = arrays["QUERY"].shape[0]
        words = {name: input_array(request, name) for name in (
            "STOP_WORDS_DICT", "BAD_WORDS_DICT", "EMBEDDING_BIAS_WORDS", "EMBEDDING_BIAS_WEIGHTS")}
        ends, pads = (self._ids(request, name, rows, default) for name, default in (("END_ID", self.end_id),
                                                                                     ("PAD_ID", self.pad_id)))
        prompts = [self.text.prompt_ids(arrays["QUERY"][r]) for r in range(rows)]
        width = max(len(prompt) for prompt in prompts)
        input_id = np.array([prompt + [pad] * (width - len(prompt)) for prompt, pad in zip(prompts, pads)])
        values = {
            "INPUT_ID": input_id,
            "REQUEST_INPUT_LEN": [[len(prompt)] for prompt in prompts],
            "DECODER_INPUT_ID": [[pad] for pad in pads],
            "REQUEST_DECODER_INPUT_LEN": np.ones((rows, 1)),
            "STOP_WORDS_IDS": self._word_lists(words["STOP_WORDS_DICT"], "STOP_WORDS_DICT", rows),
            "BAD_WORDS_IDS": self._word_lists(words["BAD_WORDS_DICT"], "BAD_WORDS_DICT", rows),
            "EMBEDDING_BIAS": self._bias(words["EMBEDDING_BIAS_WORDS"], words["EMBEDDING_BIAS_WEIGHTS"], rows),
            "REQUEST_OUTPUT_LEN": arrays["REQUEST_OUTPUT_LEN"],
            "OUT_END_ID": [[end] for end in ends],
            "OUT_PAD_ID": [[pad] for pad in pads],
        }
        return {name: np.asarray(values[name], dtype=tensor.numpy) for name, tensor in PREPROCESSING_OUTPUTS.items()}

    def _ids(self, request: InferenceRequest, name: str, rows: int, default: int) -> list[int]:
        array = input_array(request, name)
        if array is None:
            return [default] * rows
        if array.size != rows:
            raise RequestError(f"{name} must hold one id per row, got {array.size} for {rows} rows")
        ids = [int(i) for i in array.reshape(-1)]
        self.text.check_ids(ids, name)
        return ids

    def _word_lists(self, array: np.ndarray | None, name: str, rows: int) -> np.ndarray:
        if array is None:
            return np.empty((rows, 2, 0), dtype=np.int32)
        return word_list_rows([self.text.sequences(array[r], name) for r in range(rows)])

    def _bias(self, words: np.ndarray | None, weights: np.ndarray | None, rows: int) -> np.ndarray:
        if words is None or weights is None:
            return np.empty((rows, 0), dtype=np.float32)
        bias = np.zeros((rows, self.text.vocab_size), dtype=np.float32)
        for r in range(rows):
            for token, weight in self.text.logit_bias(words[r], weights[r]):
                bias[r, token] += weight
        return bias
