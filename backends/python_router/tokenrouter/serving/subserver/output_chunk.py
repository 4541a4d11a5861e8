"""A subserver's output for one response: the chunk its decoding loop produced, as the tensors of
schema.SUBSERVER_OUTPUTS that the response carries, and the in-band error that ends a front's request."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection

import numpy as np

from ..schema import SUBSERVER_OUTPUTS


@dataclass
class OutputChunk:
    """One response's worth of a request's output, as the decoding loop produced it."""

    tokens: list[int]
    origins: list[bytes]  # the model name of every token, encoded
    prefix: list[int]  # up to PREFIX_TOKENS tokens sent before this chunk (UTF-8 safe decoding)
    finish_reason: str | None
    large_share: float  # of all output so far, this chunk's tokens included
    logprobs: list[float]  # one per token when the request returns log probabilities, else empty

    @property
    def final(self) -> bool:
        return self.finish_reason is not None

    def absorb(self, later: "OutputChunk") -> None:
        """Append the chunk that followed this one: the prefix before this one precedes both."""
        self.tokens += later.tokens
        self.origins += later.origins
        self.logprobs += later.logprobs
        self.finish_reason, self.large_share = later.finish_reason, later.large_share

    def tensors(self, wanted: Collection[str] | None = None) -> dict[str, np.ndarray]:
        """The subserver's outputs (schema.SUBSERVER_OUTPUTS, but the error ones), each one batch
        row; only those in ``wanted`` (None: all). A tensor costs in every process it crosses."""
        values = {"output_ids": self.tokens, "prefix_ids": self.prefix, "output_models": self.origins,
                  "output_log_probs": self.logprobs, "finish_reason": (self.finish_reason or "").encode(),
                  "large_model_share": self.large_share, "is_final": self.final}
        return {name: SUBSERVER_OUTPUTS[name].row(value) for name, value in values.items()
                if wanted is None or name in wanted}


def in_band_error(message: str, code_name: str) -> dict[str, np.ndarray]:
    """A front's failed request's last response, as data (error_codes.py says why)."""
    return {**OutputChunk([], [], [], "error", 0.0, []).tensors(),
            "error": SUBSERVER_OUTPUTS["error"].row(message.encode()),
            "error_code": SUBSERVER_OUTPUTS["error_code"].row(code_name.encode())}
