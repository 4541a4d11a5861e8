"""Triton model `postprocessing`, for clients that call the entry subserver themselves: one chunk of
its output -> text_output, UTF-8 safe and stateless (detokenize.py), with output_ids,
output_models, finish_reason and large_model_share as the fronts answer them (front_outputs.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .detokenize import chunk_text
from .front_outputs import EntryChunk, chunk_outputs
from .python_model import RequestError, TokenizerModel, input_array
from .schema import POSTPROCESSING_INPUTS


class TritonPythonModel(TokenizerModel):
    def respond(self, request: Any) -> dict[str, np.ndarray]:
        arrays = {name: input_array(request, name) for name in POSTPROCESSING_INPUTS}
        missing = [name for name, value in arrays.items() if value is None]
        if missing:
            raise RequestError(f"postprocessing needs {', '.join(missing)}")
        chunk = EntryChunk.of(arrays)
        return chunk_outputs(chunk, chunk_text(self.codec, chunk.prefix.tolist(), chunk.tokens.tolist(), chunk.final))
