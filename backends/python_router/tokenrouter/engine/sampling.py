"""Per-request sampling, reproducible by construction.

The random draw for the token at context position ``p`` of a request with seed ``s`` comes from a
generator seeded with (s, p) alone. Batch composition, scheduling order and which model sampled
the previous token never change it, so routed runs replay exactly and a naive reference can
reproduce them.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .base import SamplingParams

_MIX = 0x9E3779B97F4A7C15  # 64-bit golden ratio: spreads (seed, position) over the seed space


def draw_seed(seed: int, position: int) -> int:
    return ((seed * _MIX) ^ (position + 1) * 0xBF58476D1CE4E5B9) & 0x7FFF_FFFF_FFFF_FFFF


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus) on one row; filtered entries become -inf.
    ``top_p`` 0 or 1 filters nothing (0 is TensorRT-LLM's "unset")."""
    scaled = logits.float() / params.temperature
    if 0 < params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if 0.0 < params.top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # Drop a token when the mass before it already reaches top_p (the top token always stays).
        drop_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= params.top_p
        drop = torch.empty_like(drop_sorted).scatter_(0, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return scaled


def sample_tokens(logits: torch.Tensor, params: Sequence[SamplingParams], positions: Sequence[int]) -> torch.Tensor:
    """One token per row of ``logits`` [B, V]; ``positions[i]`` is the position being sampled.

    Greedy rows are one vectorized argmax; sampled rows draw with the exponential-race trick
    (argmax of p / Exp(1)), which equals sampling from p.
    """
    tokens = torch.argmax(logits, dim=-1)
    for row, (row_params, position) in enumerate(zip(params, positions)):
        if row_params.greedy:
            continue
        probs = torch.softmax(filter_logits(logits[row], row_params), dim=-1)
        generator = torch.Generator(device=logits.device).manual_seed(draw_seed(row_params.seed, position))
        race = torch.empty_like(probs).exponential_(generator=generator)
        tokens[row] = torch.argmax(probs / race)
    return tokens


def sampled_log_prob(logits: torch.Tensor | None, params: SamplingParams, token: int) -> float:
    """TensorRT-LLM's ``output_log_probs`` for ``token`` sampled from the row ``logits`` [V]: its
    log-probability in the distribution it was drawn from (the processed logits after temperature,
    top-k and top-p, renormalized over what those kept). Greedy decoding draws from the top token
    alone, so it reports 0.0, as TensorRT-LLM does."""
    if params.greedy:
        return 0.0
    assert logits is not None, "a random draw's step returns its logits (engine.base.full_logits_needed)"
    return float(torch.log_softmax(filter_logits(logits, params), dim=-1)[token])
