"""Paged attention for transformers' decoder layers.

transformers computes q/k/v (with RoPE, biases, q/k norms) in its own modules and then calls the
function registered for ``config._attn_implementation``. We register ``ATTN_IMPLEMENTATION`` so
that each layer, instead of attending over a padded batch, writes the step's new keys/values into
the paged pool and attends over each row's cached context gathered through its block table.

A step runs as one packed sequence (all rows' new tokens back to back, explicit position ids).
Attention runs per group of rows with similar query counts (``query_groups``), so decode rows are
never padded to a prefill's length. The index tensors and the causal masks depend only on the
step's shape, so ``StepLayout`` builds them once per step and every layer reuses them.
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


def query_groups(counts: Sequence[int]) -> list[list[int]]:
    """Rows whose queries share one SDPA call, by number of new tokens.

    One padded call over every row would pad each decode row to the longest prefill's query count
    (a 2048-token prefill next to 63 decodes would hold 64 x 2048 query rows of scores). Grouping
    by powers of two (1, 2, 3-4, 5-8, ...) keeps query padding under 2x within a group, at the cost
    of one attention call per distinct group in every layer.
    """
    groups: dict[int, list[int]] = {}
    for row, count in enumerate(counts):
        groups.setdefault((count - 1).bit_length(), []).append(row)
    return [groups[key] for key in sorted(groups)]


@dataclass
class AttentionGroup:
    """Rows of one step attended in one batched SDPA call.

    Rows are padded to ``max_query`` queries and ``max_blocks * block_size`` keys; padded queries
    repeat the row's last query (their outputs are dropped), keys past a row's context (its last
    block's tail, padding blocks) are masked.
    """

    block_tables: torch.Tensor  # [R, max_blocks] each row's blocks in context order (padded with 0)
    query_index: torch.Tensor  # [R, max_query] packed index of each row's queries
    token_index: torch.Tensor  # [Tg] packed indices of the group's new tokens
    output_index: torch.Tensor | None  # [Tg] index into [R * max_query] per token; None: one query per row
    mask: torch.Tensor  # bool [R, 1, max_query, max_blocks * block_size]: query may attend key

    @classmethod
    def build(cls, tables: Sequence[Sequence[int]], starts: torch.Tensor, counts: torch.Tensor,
              offsets: torch.Tensor, block_size: int, device: torch.device) -> "AttentionGroup":
        """One group from its rows' block tables, cached lengths, new-token counts and packed offsets."""
        max_query = int(counts.max())
        padded = _padded(tables)
        max_blocks = padded.shape[1]
        query_j = torch.minimum(torch.arange(max_query)[None, :], (counts - 1)[:, None])
        query_pos = starts[:, None] + query_j  # [R, max_query]
        key_pos = torch.arange(max_blocks * block_size)
        mask = (key_pos[None, None, :] <= query_pos[:, :, None])[:, None]
        row_of_token = torch.repeat_interleave(torch.arange(len(tables)), counts)
        j_of_token = torch.arange(int(counts.sum())) - (torch.cumsum(counts, 0) - counts)[row_of_token]
        return cls(
            block_tables=padded.to(device),
            query_index=(offsets[:, None] + query_j).to(device),
            token_index=(offsets[row_of_token] + j_of_token).to(device),
            output_index=None if max_query == 1 else (row_of_token * max_query + j_of_token).to(device),
            mask=mask.to(device),
        )


@dataclass
class StepLayout:
    """Where one step's tokens go in the pool and which rows attend together."""

    cache: PagedKVCache
    num_tokens: int  # T: new tokens in the step
    positions: torch.Tensor  # [T] context position of each new token (the model's position ids)
    last_index: torch.Tensor  # [R] packed index of each row's last new token
    slot_mapping: torch.Tensor  # [T] flat pool slot (block * block_size + offset) of each new token
    groups: list[AttentionGroup]

    @classmethod
    def build(cls, cache: PagedKVCache, block_tables: Sequence[Sequence[int]], starts: Sequence[int],
              counts: Sequence[int], block_size: int, device: torch.device) -> "StepLayout":
        """``starts[r]`` tokens of row r are cached already; ``counts[r]`` new ones follow."""
        starts_t = torch.tensor(starts, dtype=torch.long)
        counts_t = torch.tensor(counts, dtype=torch.long)
        offsets = torch.cumsum(counts_t, 0) - counts_t  # first packed index of each row

        row_of_token = torch.repeat_interleave(torch.arange(len(counts)), counts_t)
        positions = starts_t[row_of_token] + torch.arange(int(counts_t.sum())) - offsets[row_of_token]
        blocks = _padded(block_tables)[row_of_token, positions // block_size]
        slot_mapping = blocks * block_size + positions % block_size

        groups = []
        for rows in query_groups(counts):
            index = torch.tensor(rows, dtype=torch.long)
            groups.append(AttentionGroup.build([block_tables[r] for r in rows], starts_t[index], counts_t[index],
                                               offsets[index], block_size, device))
        return cls(
            cache=cache,
            num_tokens=int(counts_t.sum()),
            positions=positions.to(device),
            last_index=(offsets + counts_t - 1).to(device),
            slot_mapping=slot_mapping.to(device),
            groups=groups,
        )


def _padded(tables: Sequence[Sequence[int]]) -> torch.Tensor:
    """Block tables as one [R, max_blocks] tensor, short rows padded with block 0 (masked anyway)."""
    max_blocks = max(len(table) for table in tables)
    return torch.tensor([list(table) + [0] * (max_blocks - len(table)) for table in tables], dtype=torch.long)


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

    q = query[0].transpose(0, 1)  # [T, H, D]
    heads = q.shape[1]
    if len(layout.groups) == 1:
        return _attend(layout.groups[0], q, key_pool, value_pool, scaling).unsqueeze(0), None
    out = q.new_empty(layout.num_tokens, heads, head_dim)
    for group in layout.groups:
        out.index_copy_(0, group.token_index, _attend(group, q, key_pool, value_pool, scaling))
    return out.unsqueeze(0), None


def _attend(group: AttentionGroup, q: torch.Tensor, key_pool: torch.Tensor, value_pool: torch.Tensor,
            scaling: float | None) -> torch.Tensor:
    """The group's attention output [Tg, H, D], its tokens in packed order."""
    rows, _ = group.block_tables.shape
    kv_heads, head_dim = key_pool.shape[2:]
    flat_tables = group.block_tables.flatten()
    k = key_pool.index_select(0, flat_tables).view(rows, -1, kv_heads, head_dim).transpose(1, 2)  # [R, KVH, L, D]
    v = value_pool.index_select(0, flat_tables).view(rows, -1, kv_heads, head_dim).transpose(1, 2)
    group_q = q[group.query_index]  # [R, Q, H, D]
    out = F.scaled_dot_product_attention(group_q.transpose(1, 2), k, v, attn_mask=group.mask, scale=scaling,
                                         enable_gqa=kv_heads != group_q.shape[2])
    out = out.transpose(1, 2).reshape(-1, q.shape[1], head_dim)  # [R * Q, H, D]
    return out if group.output_index is None else out[group.output_index]


AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
