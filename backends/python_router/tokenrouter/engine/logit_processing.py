"""TensorRT-LLM's logit processing before sampling: logit bias, penalties, min_tokens.

What each does, as TensorRT-LLM's penalty kernel does it (``batchApplyPenalty``):

- ``logit_bias`` (TensorRT-LLM's ``embedding_bias``): its weight is added to the token's logit.
- The penalties see how often each token occurs in the whole context: the prompt and every
  output token, whichever model of the route produced it. For a token that occurs at least once,
  ``repetition_penalty`` divides a positive logit and multiplies a negative one,
  ``presence_penalty`` is subtracted once and ``frequency_penalty`` once per occurrence. The two
  subtractions apply to the temperature-scaled logit in TensorRT-LLM (bias, then temperature,
  then the penalties); the sampler divides by the temperature afterwards, so here they are scaled
  by the temperature first (1 for greedy), which is the same function.
- ``min_tokens``: the request's end ids cannot be sampled while it has fewer output tokens.

An engine sees every context token of a sequence exactly once, in order, through its steps' new
tokens (prefill, decode, and the extend that carries another model's tokens), so the occurrence
counts it keeps (``ContextCounts``) are the request's, whichever model sampled them.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .base import SamplingParams, SeqId, StepRow


class ContextCounts:
    """Per held sequence whose sampling has a penalty: how often each token occurs in its context.

    A sequence is counted from its first step on (its sampling never changes); ``forget`` it when
    it is released.
    """

    def __init__(self) -> None:
        self._counts: dict[SeqId, torch.Tensor] = {}  # int32 [V], on the logits' device

    def record(self, rows: Sequence[StepRow], positions: Sequence[int], vocab_size: int,
               device: torch.device) -> None:
        """Count the new tokens of every row whose sampling counts tokens."""
        for row, position in zip(rows, positions):
            if not row.sampling.counts_tokens:
                continue
            counts = self._counts.get(row.seq_id)
            if counts is None:
                if position != len(row.new_tokens):
                    raise ValueError(f"sequence {row.seq_id!r}: penalties asked for after its first step")
                counts = self._counts[row.seq_id] = torch.zeros(vocab_size, dtype=torch.int32, device=device)
            new = torch.tensor(list(row.new_tokens), dtype=torch.long, device=device)
            counts.index_add_(0, new, torch.ones_like(new, dtype=torch.int32))

    def of(self, seq_id: SeqId) -> torch.Tensor:
        return self._counts[seq_id]

    def forget(self, seq_id: SeqId) -> None:
        self._counts.pop(seq_id, None)

    def __contains__(self, seq_id: SeqId) -> bool:
        return seq_id in self._counts


def needs_processing(params: Sequence[SamplingParams]) -> bool:
    return any(p.processes_logits for p in params)


def process_logits(logits: torch.Tensor, rows: Sequence[StepRow], positions: Sequence[int],
                   counts: ContextCounts) -> torch.Tensor:
    """The logits [B, V] each row samples from: a new tensor where a row asks for processing, the
    same tensor otherwise (a batch without processing costs one pass over the rows' parameters)."""
    params = [row.sampling for row in rows]
    chosen = [i for i, p in enumerate(params) if p.processes_logits]
    if not chosen:
        return logits
    out = logits.float().clone()
    for i in chosen:
        if params[i].logit_bias:
            ids, weights = zip(*params[i].logit_bias)
            index = torch.tensor(ids, dtype=torch.long, device=out.device)
            out[i, index] += torch.tensor(weights, dtype=out.dtype, device=out.device)
    penalized = [i for i in chosen if params[i].counts_tokens]
    if penalized:
        out[penalized] = _penalize(out[penalized], [params[i] for i in penalized],
                                   torch.stack([counts.of(rows[i].seq_id) for i in penalized]))
    for i in chosen:
        p = params[i]
        if p.end_ids and positions[i] - p.prompt_len < p.min_tokens:
            out[i, [t for t in p.end_ids if 0 <= t < out.shape[-1]]] = float("-inf")
    return out


def _penalize(logits: torch.Tensor, params: Sequence[SamplingParams], counts: torch.Tensor) -> torch.Tensor:
    """Repetition, presence and frequency penalties on rows [n, V] with occurrence counts [n, V]."""
    def column(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=logits.dtype, device=logits.device)[:, None]

    repetition = column([p.repetition_penalty for p in params])
    presence = column([p.presence_penalty for p in params])
    frequency = column([p.frequency_penalty for p in params])
    scale = column([p.temperature if p.temperature > 0 else 1.0 for p in params])
    occurs = counts > 0
    logits = torch.where(occurs, torch.where(logits < 0, logits * repetition, logits / repetition), logits)
    return logits - scale * (presence * occurs + frequency * counts.to(logits.dtype))
