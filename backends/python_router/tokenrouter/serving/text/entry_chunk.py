"""The entry subserver's responses as read by the processes that turn them into text: a front,
and the standalone postprocessing model (for clients that call the entry themselves).

Triton-free: one response's tensors (schema.SUBSERVER_OUTPUTS) in, an ``EntryChunk`` out, and the
outputs that both answer for a chunk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..schema import CLIENT_OUTPUTS


@dataclass
class EntryChunk:
    """One response of the entry subserver (schema.SUBSERVER_OUTPUTS), flattened."""

    tokens: np.ndarray
    prefix: np.ndarray
    models: np.ndarray
    logprobs: np.ndarray
    finish_reason: str
    large_share: float
    final: bool
    error: str = ""  # with finish_reason "error": the message, and the code's name (error_codes.py)
    error_code: str = ""

    @classmethod
    def of(cls, outputs: Mapping[str, np.ndarray]) -> "EntryChunk":
        def flat(name: str) -> np.ndarray:
            array = outputs.get(name)
            return np.zeros(0) if array is None else array.reshape(-1)

        def text(name: str) -> str:
            return flat(name)[0].decode() if name in outputs else ""

        return cls(flat("output_ids"), flat("prefix_ids"), flat("output_models"), flat("output_log_probs"),
                   text("finish_reason"), float(flat("large_model_share")[0]), bool(flat("is_final")[0]),
                   text("error"), text("error_code"))


def chunk_outputs(chunk: EntryChunk, text: str) -> dict[str, np.ndarray]:
    """What postprocessing and the fronts both answer for a chunk: its text and our outputs."""
    return {"text_output": np.array([text.encode("utf-8")], dtype=np.object_),
            "output_ids": CLIENT_OUTPUTS["output_ids"].row(chunk.tokens),
            "output_models": CLIENT_OUTPUTS["output_models"].row(chunk.models),
            "finish_reason": CLIENT_OUTPUTS["finish_reason"].row(chunk.finish_reason.encode()),
            "large_model_share": CLIENT_OUTPUTS["large_model_share"].row(chunk.large_share)}
