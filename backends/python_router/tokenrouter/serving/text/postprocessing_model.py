"""Triton model `postprocessing`: TensorRT-LLM's, for pipelines that compose their own (its names,
dtypes and dims at tensorrtllm_backend c2e65b88): ``TOKENS_BATCH`` [rows, beams, n] with
``SEQUENCE_LENGTH`` [rows, beams] -> ``OUTPUT``, one string per row and beam, each decoding the first
``SEQUENCE_LENGTH`` ids of its beam as a front decodes a whole generation (detokenize.py).

A client calls this model directly: its input is bounded by its shape before any id is read (no row
of a context holds more ids than the context limit; 4M ids were once read for seconds before the
refusal), and ids outside the vocabulary are refused by name.
"""

from __future__ import annotations

import numpy as np

from ..triton_api import InferenceRequest
from .detokenize import chunk_text
from .input_limits import context_limit
from .tokenizer_stub import RequestError, TokenizerModel, input_array


class TritonPythonModel(TokenizerModel):
    def initialize(self, args: dict[str, str]) -> None:
        super().initialize(args)
        self.max_ids = context_limit(self.parameters, self.tokenizer_path)
        self.vocab_size = len(self.codec.tokenizer)

    def respond(self, request: InferenceRequest) -> dict[str, np.ndarray]:
        tokens, lengths = input_array(request, "TOKENS_BATCH"), input_array(request, "SEQUENCE_LENGTH")
        if tokens is None or lengths is None:
            raise RequestError("postprocessing needs TOKENS_BATCH and SEQUENCE_LENGTH")
        if tokens.ndim != 3 or tokens.shape[2] > self.max_ids:
            raise RequestError(f"TOKENS_BATCH must be [rows, beams, n] with n <= {self.max_ids} (the context limit), "
                               f"got {list(tokens.shape)}")
        if lengths.shape != tokens.shape[:2]:
            raise RequestError(f"SEQUENCE_LENGTH must be [rows, beams] = {list(tokens.shape[:2])}, "
                               f"got {list(lengths.shape)}")
        texts = []
        for row, row_lengths in zip(tokens, lengths):
            for beam, length in zip(row, row_lengths):
                if not 0 <= length <= beam.size:
                    raise RequestError(f"SEQUENCE_LENGTH {int(length)} is outside [0, {beam.size}]")
                ids = beam[:length]
                outside = ids[(ids < 0) | (ids >= self.vocab_size)]
                if outside.size:
                    raise RequestError(f"TOKENS_BATCH holds id {int(outside[0])}, outside the vocabulary "
                                       f"[0, {self.vocab_size})")
                texts.append(chunk_text(self.codec, [], ids.tolist(), True).encode("utf-8"))
        return {"OUTPUT": np.array(texts, dtype=np.object_)}
