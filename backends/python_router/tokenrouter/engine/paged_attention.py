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
    """Per-layer key and value tensors of shape [num_blocks, block_size, kv_heads, head_dim].

    Attention gathers whole blocks (contiguous runs of block_size * kv_heads * head_dim values), which
    is much cheaper than gathering token by token. Zero-filled so that the masked tail of a row's
    last block always holds finite numbers (0 * NaN would poison SDPA).
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        shape = (num_blocks, block_size, kv_heads, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]


@dataclass
class StepLayout:
    """Where one step's tokens go in the pool and what each query may see.

    Rows are padded to ``max_query`` queries and ``max_blocks * block_size`` keys for one batched
    SDPA call; padded queries repeat the row's last query (their outputs are dropped), keys past a
    row's context (its last block's tail, padding blocks) are masked.
    """

    cache: PagedKVCache
    positions: torch.Tensor  # [T] context position of each new token (the model's position ids)
    last_index: torch.Tensor  # [R] packed index of each row's last new token
    slot_mapping: torch.Tensor  # [T] flat pool slot (block * block_size + offset) of each new token
    block_tables: torch.Tensor  # [R, max_blocks] each row's blocks in context order (padded with 0)
    query_index: torch.Tensor | None  # [R, max_query] packed index of each row's queries; None: 1 per row
    output_index: torch.Tensor | None  # [T] index into [R * max_query] per packed token; None: 1 per row
    mask: torch.Tensor  # bool [R, 1, max_query, max_blocks * block_size]: query may attend key

    @classmethod
    def build(cls, cache: PagedKVCache, block_tables: Sequence[Sequence[int]], starts: Sequence[int],
              counts: Sequence[int], block_size: int, device: torch.device) -> "StepLayout":
        """``starts[r]`` tokens of row r are cached already; ``counts[r]`` new ones follow."""
        starts_t = torch.tensor(starts, dtype=torch.long)
        counts_t = torch.tensor(counts, dtype=torch.long)
        rows = len(counts)
        max_query = int(counts_t.max())

        max_blocks = max(len(table) for table in block_tables)
        tables = torch.tensor([list(table) + [0] * (max_blocks - len(table)) for table in block_tables],
                              dtype=torch.long)

        offsets = torch.cumsum(counts_t, 0) - counts_t  # first packed index of each row
        query_j = torch.minimum(torch.arange(max_query)[None, :], (counts_t - 1)[:, None])
        query_pos = starts_t[:, None] + query_j  # [R, max_query]
        key_pos = torch.arange(max_blocks * block_size)
        mask = (key_pos[None, None, :] <= query_pos[:, :, None])[:, None]

        row_of_token = torch.repeat_interleave(torch.arange(rows), counts_t)
        j_of_token = torch.arange(int(counts_t.sum())) - offsets[row_of_token]
        positions = starts_t[row_of_token] + j_of_token
        slot_mapping = tables[row_of_token, positions // block_size] * block_size + positions % block_size
        decode_only = max_query == 1  # packed token r is row r's only query: no reshuffling needed

        return cls(
            cache=cache,
            positions=positions.to(device),
            last_index=(offsets + counts_t - 1).to(device),
            slot_mapping=slot_mapping.to(device),
            block_tables=tables.to(device),
            query_index=None if decode_only else (offsets[:, None] + query_j).to(device),
            output_index=None if decode_only else (row_of_token * max_query + j_of_token).to(device),
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
    kv_heads, head_dim = key_pool.shape[2:]
    key_pool.view(-1, kv_heads, head_dim).index_copy_(0, layout.slot_mapping, key[0].transpose(0, 1))
    value_pool.view(-1, kv_heads, head_dim).index_copy_(0, layout.slot_mapping, value[0].transpose(0, 1))

    rows, max_blocks = layout.block_tables.shape
    flat_tables = layout.block_tables.flatten()
    k = key_pool.index_select(0, flat_tables).view(rows, -1, kv_heads, head_dim).transpose(1, 2)  # [R, KVH, L, D]
    v = value_pool.index_select(0, flat_tables).view(rows, -1, kv_heads, head_dim).transpose(1, 2)
    q = query[0].transpose(0, 1)  # [T, H, D]
    q = q[:, None] if layout.query_index is None else q[layout.query_index]  # [R, Q, H, D]
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=layout.mask, scale=scaling,
                                         enable_gqa=kv_heads != q.shape[2])
    heads = out.shape[1]
    out = out.transpose(1, 2).reshape(-1, heads, head_dim)  # [R * Q, H, D]
    if layout.output_index is not None:
        out = out[layout.output_index]
    return out.unsqueeze(0), None


AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
