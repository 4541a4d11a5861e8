"""Triton model `postprocessing`: one subserver chunk -> text_output, UTF-8 safe and stateless.

Passes output_ids, output_models, finish_reason and large_model_share through unchanged, so the
ensemble's every response comes from exactly one postprocessing response.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .detokenize import chunk_text
from .python_model import RequestError, TokenizerModel, input_array

PASSTHROUGH = ("output_ids", "output_models", "finish_reason", "large_model_share")


class TritonPythonModel(TokenizerModel):
    def respond(self, request: Any) -> dict[str, np.ndarray]:
        arrays = {name: input_array(request, name) for name in (*PASSTHROUGH, "prefix_ids", "is_final")}
        missing = [name for name, value in arrays.items() if value is None]
        if missing:
            raise RequestError(f"postprocessing needs {', '.join(missing)}")
        text = chunk_text(self.codec, arrays["prefix_ids"].reshape(-1).tolist(),
                          arrays["output_ids"].reshape(-1).tolist(), bool(arrays["is_final"].reshape(-1)[0]))
        return {"text_output": np.array([[text.encode("utf-8")]], dtype=object),
                **{name: arrays[name] for name in PASSTHROUGH}}
