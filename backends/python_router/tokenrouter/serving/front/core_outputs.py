"""The entry subserver's chunks as ``tensorrt_llm``'s responses, with TensorRT-LLM's core output shapes.

Triton-free. One generation, one beam: ``output_ids`` [1, 1, tokens] and ``sequence_length`` [1, 1]
(the tokens in it); streaming, each response holds the tokens new in it (the last may hold none),
else one response holds them all, after the prompt unless ``exclude_input_in_output``;
``cum_log_probs`` [1, 1] and ``output_log_probs`` [1, 1, tokens] when asked; ``batch_index`` and
``sequence_index`` [1, 1]. Ours, as a front answers them: ``output_models``, ``finish_reason``,
``large_model_share``.
"""

from __future__ import annotations

import numpy as np

from ..schema import CLIENT_OUTPUTS
from ..text.entry_chunk import EntryChunk
from .front_outputs import entry_outputs, joined_chunks
from .front_request import Generation


class CoreOutput:
    """One generation's responses (the interface of front_outputs.GenerationOutput)."""

    def __init__(self, generation: Generation) -> None:
        self._generation = generation
        self._held: list[EntryChunk] = []  # not streaming: everything until the final chunk
        self._cum_log_prob = 0.0

    def entry_outputs(self) -> list[str]:
        return entry_outputs(self._generation)

    def response(self, chunk: EntryChunk) -> dict[str, np.ndarray] | None:
        generation = self._generation
        if not generation.stream:
            self._held.append(chunk)
            if not chunk.final:
                return None
            chunk = joined_chunks(self._held)
        ids = chunk.tokens.astype(np.int32)
        if generation.echo_prompt:
            ids = np.concatenate([np.asarray(generation.prompt_ids, dtype=np.int32), ids])
        outputs = {"output_ids": ids.reshape(1, 1, -1),
                   "sequence_length": np.array([[ids.size]], dtype=np.int32),
                   "batch_index": CLIENT_OUTPUTS["batch_index"].row(generation.row),
                   "sequence_index": CLIENT_OUTPUTS["sequence_index"].row(generation.sequence),
                   "output_models": CLIENT_OUTPUTS["output_models"].row(chunk.models),
                   "finish_reason": CLIENT_OUTPUTS["finish_reason"].row(chunk.finish_reason.encode()),
                   "large_model_share": CLIENT_OUTPUTS["large_model_share"].row(chunk.large_share)}
        if generation.spec.return_log_probs:
            self._cum_log_prob += float(chunk.logprobs.sum(dtype=np.float64))
            outputs["cum_log_probs"] = np.array([[self._cum_log_prob]], dtype=np.float32)
            outputs["output_log_probs"] = chunk.logprobs.astype(np.float32).reshape(1, 1, -1)
        return outputs
