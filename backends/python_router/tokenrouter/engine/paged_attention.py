"""Paged attention for transformers' decoder layers.

transformers computes q/k/v (with RoPE, biases, q/k norms) in its own modules and then calls the
function registered for ``config._attn_implementation``. We register ``ATTN_IMPLEMENTATION`` so
that each layer, instead of attending over a padded batch, writes the step's new keys/values into
the paged pool and attends over each row's cached context gathered through its block table.

A step runs as one packed sequence (all rows' new tokens back to back, explicit position ids). The
index tensors and the causal mask depend only on the step's shape, so ``StepLayout`` builds them
once per step and every layer reuses them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

ATTN_IMPLEMENTATION = "tokenrouter_paged"
LAYOUT_KWARG = "paged_layout"


class PagedKVCache:
    """Per-layer key and value tensors of shape [num_blocks * block_size, kv_heads, head_dim].

    Zero-filled so that slots a mask hides still hold finite numbers (0 * NaN would poison SDPA).
    """

    def __init__(self, num_layers: int, num_slots: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        shape = (num_slots, kv_heads, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]


@dataclass
class StepLayout:
    """Where one step's tokens go in the pool and what each query may see.

    Rows are padded to ``max_query`` queries and ``max_context`` keys for one batched SDPA call;
    padded queries repeat the row's last query (their outputs are dropped), padded keys are masked.
    """

    cache: PagedKVCache
    positions: torch.Tensor  # [T] context position of each new token (the model's position ids)
    last_index: torch.Tensor  # [R] packed index of each row's last new token
    slot_mapping: torch.Tensor  # [T] pool slot of each new token
    context_slots: torch.Tensor  # [R, max_context] pool slot of each context position (0 = pad)
    query_index: torch.Tensor  # [R, max_query] packed index of each row's queries (padded by repeat)
    output_index: torch.Tensor  # [T] index into [R * max_query] for each packed token
    mask: torch.Tensor  # bool [R, 1, max_query, max_context]: query may attend key

    @classmethod
    def build(cls, cache: PagedKVCache, block_tables: Sequence[Sequence[int]], starts: Sequence[int],
              counts: Sequence[int], block_size: int, device: torch.device) -> "StepLayout":
        """``starts[r]`` tokens of row r are cached already; ``counts[r]`` new ones follow."""
        starts_t = torch.tensor(starts, dtype=torch.long)
        counts_t = torch.tensor(counts, dtype=torch.long)
        rows = len(counts)
        max_query = int(counts_t.max())
        context_lens = starts_t + counts_t
        max_context = int(context_lens.max())

        max_blocks = max(len(table) for table in block_tables)
        tables = torch.zeros(rows, max_blocks, dtype=torch.long)
        for row, table in enumerate(block_tables):
            tables[row, : len(table)] = torch.tensor(table, dtype=torch.long)
        key_pos = torch.arange(max_context)
        context_slots = tables[:, key_pos // block_size] * block_size + key_pos % block_size
        context_slots = context_slots.masked_fill(key_pos >= context_lens[:, None], 0)

        offsets = torch.cumsum(counts_t, 0) - counts_t  # first packed index of each row
        query_j = torch.minimum(torch.arange(max_query)[None, :], (counts_t - 1)[:, None])
        query_index = offsets[:, None] + query_j
        query_pos = starts_t[:, None] + query_j  # [R, max_query]
        mask = (key_pos[None, None, :] <= query_pos[:, :, None])[:, None]

        row_of_token = torch.repeat_interleave(torch.arange(rows), counts_t)
        j_of_token = torch.arange(int(counts_t.sum())) - offsets[row_of_token]
        positions = starts_t[row_of_token] + j_of_token
        slot_mapping = tables[row_of_token, positions // block_size] * block_size + positions % block_size

        return cls(
            cache=cache,
            positions=positions.to(device),
            last_index=(offsets + counts_t - 1).to(device),
            slot_mapping=slot_mapping.to(device),
            context_slots=context_slots.to(device),
            query_index=query_index.to(device),
            output_index=(row_of_token * max_query + j_of_token).to(device),
            mask=mask.to(device),
        )


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    sliding_window: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention hook: query [1, H, T, D], key/value [1, KVH, T, D] for the new tokens.

    Returns [1, T, H, D] like transformers' own implementations.
    """
    layout: StepLayout = kwargs[LAYOUT_KWARG]
    if sliding_window is not None:
        raise NotImplementedError("sliding-window layers are not supported by the paged engine")
    layer = module.layer_idx
    key_pool, value_pool = layout.cache.keys[layer], layout.cache.values[layer]
    # Write first, then gather: each row's context then includes its own new tokens.
    key_pool.index_copy_(0, layout.slot_mapping, key[0].transpose(0, 1))
    value_pool.index_copy_(0, layout.slot_mapping, value[0].transpose(0, 1))

    q = query[0].transpose(0, 1)[layout.query_index].transpose(1, 2)  # [R, H, Q, D]
    k = key_pool[layout.context_slots].transpose(1, 2)  # [R, KVH, L, D]
    v = value_pool[layout.context_slots].transpose(1, 2)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=layout.mask, scale=scaling,
                                         enable_gqa=k.shape[1] != q.shape[1])
    rows, heads, max_query, head_dim = out.shape
    out = out.transpose(1, 2).reshape(rows * max_query, heads, head_dim)[layout.output_index]
    return out.unsqueeze(0), None


AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
