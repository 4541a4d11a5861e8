"""Triton model `postprocessing`, for clients that call the entry subserver themselves: one chunk of
its output -> text_output, UTF-8 safe and stateless (detokenize.py), with output_ids,
output_models, finish_reason and large_model_share as the fronts answer them (entry_chunk.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..schema import POSTPROCESSING_INPUTS
from .detokenize import chunk_text
from .entry_chunk import EntryChunk, chunk_outputs
from .input_limits import context_limit
from .tokenizer_stub import RequestError, TokenizerModel, input_array


class TritonPythonModel(TokenizerModel):
    def initialize(self, args: dict[str, str]) -> None:
        super().initialize(args)
        # A client calls this model directly: ids outside the vocabulary answered INTERNAL
        # (OverflowError), and 10^6 of them took 5 s. No chunk of a context holds more ids than it.
        self.max_ids = context_limit(self.parameters, self.tokenizer_path)
        self.vocab_size = len(self.codec.tokenizer)

    def respond(self, request: Any) -> dict[str, np.ndarray]:
        arrays = {name: input_array(request, name) for name in POSTPROCESSING_INPUTS}
        missing = [name for name, value in arrays.items() if value is None]
        if missing:
            raise RequestError(f"postprocessing needs {', '.join(missing)}")
        chunk = EntryChunk.of(arrays)
        for name, ids in (("output_ids", chunk.tokens), ("prefix_ids", chunk.prefix)):
            self._check_ids(name, ids)
        return chunk_outputs(chunk, chunk_text(self.codec, chunk.prefix.tolist(), chunk.tokens.tolist(), chunk.final))

    def _check_ids(self, name: str, ids: np.ndarray) -> None:
        if ids.size > self.max_ids:
            raise RequestError(f"{name} holds {ids.size} ids; the limit is {self.max_ids} (the context limit)")
        outside = ids[(ids < 0) | (ids >= self.vocab_size)]
        if outside.size:
            raise RequestError(f"{name} holds id {int(outside[0])}, outside the vocabulary [0, {self.vocab_size})")
