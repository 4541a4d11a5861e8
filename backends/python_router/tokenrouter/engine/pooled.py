"""What every engine shares: KV bookkeeping on a BlockPool, the checks a step makes before it
changes anything, and turning next-token logits into a StepResult with reproducible sampling."""

from __future__ import annotations

import operator
from typing import Callable, Sequence

import torch

from .base import Engine, SeqId, StepResult, StepRow, UnknownSequence, full_logits_needed
from .kv_pool import BlockPool
from .logit_processing import ContextCounts, needs_processing, process_logits
from .sampling import sample_tokens


def check_rows(rows: Sequence[StepRow], *, top_logits: int, vocab_size: int, max_model_len: int,
               cached_length: Callable[[SeqId], int]) -> list[tuple[int, ...]]:
    """Every check before a step changes state; returns each row's new tokens as ints.

    ``cached_length(seq_id)`` gives a held sequence's length and raises UnknownSequence otherwise.
    """
    if not rows:
        raise ValueError("a step needs at least one row")
    if not 0 <= top_logits <= vocab_size:
        raise ValueError(f"top_logits must lie in [0, {vocab_size}], got {top_logits}")
    seen: set[SeqId] = set()
    tokens = []
    for row in rows:
        length = cached_length(row.seq_id)
        if row.seq_id in seen:
            raise ValueError(f"sequence {row.seq_id!r} appears twice in one step")
        seen.add(row.seq_id)
        try:
            new = tuple(operator.index(t) for t in row.new_tokens)
        except TypeError:
            raise ValueError(f"sequence {row.seq_id!r}: token ids must be integers") from None
        if not new:
            raise ValueError(f"sequence {row.seq_id!r}: a row needs at least one new token")
        if min(new) < 0 or max(new) >= vocab_size:
            raise ValueError(f"sequence {row.seq_id!r}: token ids must lie in [0, {vocab_size}), "
                             f"got {min(new)}..{max(new)}")
        if length + len(new) > max_model_len:
            raise ValueError(f"sequence {row.seq_id!r}: {length + len(new)} tokens exceed max_model_len "
                             f"{max_model_len}")
        tokens.append(new)
    return tokens


def sampled_result(rows: Sequence[StepRow], logits: torch.Tensor, positions: Sequence[int], top_logits: int,
                   hidden: torch.Tensor | None = None, *, counts: ContextCounts,
                   return_logits: bool = True) -> StepResult:
    """Process each row's next-token logits [B, V] (on their device; ``counts`` holds the engine's
    context counts and learns the rows' new tokens), sample each row and return CPU tensors (the
    logits only when ``full_logits_needed``)."""
    if needs_processing([row.sampling for row in rows]):
        counts.record(rows, positions, logits.shape[-1], logits.device)
        logits = process_logits(logits, rows, positions, counts)
    result = StepResult(
        seq_ids=[row.seq_id for row in rows],
        sampled=sample_tokens(logits, [row.sampling for row in rows], positions).cpu(),
        logits=logits.cpu() if full_logits_needed(rows, return_logits) else None,
        positions=torch.tensor(list(positions), dtype=torch.int64),
        hidden=None if hidden is None else hidden.cpu(),
    )
    if top_logits:
        top = torch.topk(logits, top_logits, dim=-1)
        result.topk_values, result.topk_indices = top.values.cpu(), top.indices.cpu()
    return result


class PooledEngine(Engine):
    """An engine whose KV accounting is a BlockPool of ``num_blocks`` x ``block_size`` tokens."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self._pool = BlockPool(num_blocks, block_size)
        self._context_counts = ContextCounts()  # for penalties (see logit_processing.py)

    @property
    def block_size(self) -> int:
        return self._pool.block_size

    @property
    def num_total_blocks(self) -> int:
        return self._pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self._pool.num_free

    def add_sequence(self, seq_id: SeqId) -> None:
        self._pool.add(seq_id)

    def has_sequence(self, seq_id: SeqId) -> bool:
        return seq_id in self._pool

    def num_cached(self, seq_id: SeqId) -> int:
        return self._pool.length(seq_id)

    def sequence_ids(self) -> list[SeqId]:
        return self._pool.sequence_ids()

    def release(self, seq_id: SeqId) -> bool:
        self._context_counts.forget(seq_id)
        return self._pool.free(seq_id)

    def release_all(self) -> None:
        for seq_id in self._pool.sequence_ids():
            self.release(seq_id)

    def check_rows(self, rows: Sequence[StepRow], top_logits: int) -> list[tuple[int, ...]]:
        return check_rows(rows, top_logits=top_logits, vocab_size=self.vocab_size, max_model_len=self.max_model_len,
                          cached_length=self._cached_length)

    def _cached_length(self, seq_id: SeqId) -> int:
        if seq_id not in self._pool:
            raise UnknownSequence(seq_id)
        return self._pool.length(seq_id)
