"""The entry subserver's chunks as a client's responses, with TensorRT-LLM's output shapes.

Triton-free. Shapes are those TensorRT-LLM's ensemble and tensorrt_llm_bls answer for one
generation: ``text_output`` flat, one string (``as_numpy("text_output")[0].decode()``);
``batch_index``, ``sequence_index``, ``cum_log_probs`` as [1, 1] (``[0][0]``); ``output_log_probs``
as [1, 1, tokens] (one beam). Ours are one batch row: ``output_ids`` and ``output_models``
[1, tokens], ``finish_reason`` and ``large_model_share`` [1, 1]; when asked, ``num_input_tokens`` and
``num_output_tokens`` [1, 1] (the counts Triton's OpenAI frontend reads for ``usage``).
"""

from __future__ import annotations

import numpy as np

from ...text import TextCodec
from ..schema import CLIENT_OUTPUTS, PREFIX_TOKENS, SUBSERVER_OUTPUTS
from ..text.detokenize import chunk_text
from ..text.entry_chunk import EntryChunk, chunk_outputs
from .front_request import Generation


def entry_outputs(generation: Generation) -> list[str]:
    """The entry's outputs a generation reads (each tensor costs in every process it crosses): never
    ``prefix_ids`` (a front keeps its generation's tail), ``output_log_probs`` only when asked."""
    unread = {"prefix_ids"} if generation.spec.return_log_probs else {"prefix_ids", "output_log_probs"}
    return [name for name in SUBSERVER_OUTPUTS if name not in unread]


class GenerationOutput:
    """One generation's responses: each chunk as it comes when streaming, else one at the end.

    It keeps the generation's last PREFIX_TOKENS tokens itself, so the entry need not send
    ``prefix_ids`` (``entry_outputs``)."""

    def __init__(self, codec: TextCodec, generation: Generation) -> None:
        self._codec, self._generation = codec, generation
        self._held: list[EntryChunk] = []  # not streaming: everything until the final chunk
        self._tail: list[int] = []  # streaming: the tokens just before the next chunk
        self._cum_log_prob = 0.0

    def entry_outputs(self) -> list[str]:
        return entry_outputs(self._generation)

    def response(self, chunk: EntryChunk) -> dict[str, np.ndarray] | None:
        """The client outputs for ``chunk``; None while a non-streaming generation is not done."""
        generation = self._generation
        if generation.stream:
            tokens = chunk.tokens.tolist()
            text = chunk_text(self._codec, self._tail, tokens, chunk.final)
            self._tail = (self._tail + tokens)[-PREFIX_TOKENS:]
        else:
            self._held.append(chunk)
            if not chunk.final:
                return None
            chunk = joined_chunks(self._held)
            shown = chunk.tokens.tolist()
            if generation.echo_prompt:
                shown = [*generation.prompt_ids, *shown]
            text = chunk_text(self._codec, [], shown, True)
        outputs = chunk_outputs(chunk, text)
        outputs["batch_index"] = CLIENT_OUTPUTS["batch_index"].row(generation.row)
        outputs["sequence_index"] = CLIENT_OUTPUTS["sequence_index"].row(generation.sequence)
        if generation.count_input:
            outputs["num_input_tokens"] = CLIENT_OUTPUTS["num_input_tokens"].row(len(generation.prompt_ids))
        if generation.count_output:  # this response's: Triton's OpenAI frontend adds up a stream's
            outputs["num_output_tokens"] = CLIENT_OUTPUTS["num_output_tokens"].row(len(chunk.tokens))
        if generation.spec.return_log_probs:
            self._cum_log_prob += float(chunk.logprobs.sum(dtype=np.float64))
            outputs["cum_log_probs"] = CLIENT_OUTPUTS["cum_log_probs"].row(self._cum_log_prob)
            outputs["output_log_probs"] = chunk.logprobs.astype(np.float32).reshape(1, 1, -1)
        return outputs


def joined_chunks(chunks: list[EntryChunk]) -> EntryChunk:
    """A generation's chunks as one (its tokens, models and log probabilities in order; the last one's end)."""
    last = chunks[-1]
    if len(chunks) == 1:
        return last
    return EntryChunk(np.concatenate([c.tokens for c in chunks]), chunks[0].prefix,
                      np.concatenate([c.models for c in chunks]), np.concatenate([c.logprobs for c in chunks]),
                      last.finish_reason, last.large_share, True)
