"""Paged KV bookkeeping: a fixed pool of blocks and one block table per sequence.

Only indices live here; the tensors that hold keys and values belong to the engine. Keeping the
accounting separate makes it testable on its own and shared by every engine (PyTorch, simulated).
"""

from __future__ import annotations

from typing import Hashable

from .base import KVCacheExhausted, UnknownSequence


class BlockPool:
    """Hands out block ids; a block belongs to exactly one sequence until that sequence is freed."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # LIFO free list: recently freed blocks are reused first (warm in cache on CPU).
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._tables: dict[Hashable, list[int]] = {}
        self._lengths: dict[Hashable, int] = {}

    # --- queries --------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    def __contains__(self, seq_id: Hashable) -> bool:
        return seq_id in self._tables

    def sequence_ids(self) -> list[Hashable]:
        return list(self._tables)

    def length(self, seq_id: Hashable) -> int:
        return self._lengths[self._check(seq_id)]

    def block_table(self, seq_id: Hashable) -> list[int]:
        return self._tables[self._check(seq_id)]

    def blocks_needed(self, seq_id: Hashable, extra_tokens: int) -> int:
        """New blocks that appending ``extra_tokens`` to the sequence would take."""
        length = self._lengths[self._check(seq_id)]
        have = len(self._tables[seq_id])
        return max(0, -(-(length + extra_tokens) // self.block_size) - have)

    def slots(self, seq_id: Hashable, start: int, stop: int) -> list[int]:
        """Flat slot indices (block * block_size + offset) of token positions [start, stop)."""
        table = self._tables[self._check(seq_id)]
        size = self.block_size
        return [table[pos // size] * size + pos % size for pos in range(start, stop)]

    # --- changes --------------------------------------------------------------------------------
    def add(self, seq_id: Hashable) -> None:
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id!r} is already in the pool")
        self._tables[seq_id] = []
        self._lengths[seq_id] = 0

    def append(self, appends: dict[Hashable, int]) -> None:
        """Grow several sequences at once; all or nothing, so a failed step leaves no trace."""
        needed = sum(self.blocks_needed(seq_id, count) for seq_id, count in appends.items())
        if needed > len(self._free):
            raise KVCacheExhausted(
                f"KV pool exhausted: the step needs {needed} more blocks, {len(self._free)} of "
                f"{self.num_blocks} are free (block size {self.block_size})"
            )
        for seq_id, count in appends.items():
            for _ in range(self.blocks_needed(seq_id, count)):
                self._tables[seq_id].append(self._free.pop())
            self._lengths[seq_id] += count

    def truncate(self, seq_id: Hashable, length: int) -> None:
        """Shrink a sequence to its first ``length`` tokens and free the blocks it no longer needs.

        The engine uses it to undo an ``append`` whose forward pass then failed.
        """
        if not 0 <= length <= self._lengths[self._check(seq_id)]:
            raise ValueError(f"cannot truncate {seq_id!r} of length {self._lengths[seq_id]} to {length}")
        table = self._tables[seq_id]
        keep = -(-length // self.block_size)
        self._free.extend(reversed(table[keep:]))
        del table[keep:]
        self._lengths[seq_id] = length

    def free(self, seq_id: Hashable) -> bool:
        table = self._tables.pop(seq_id, None)
        if table is None:
            return False
        del self._lengths[seq_id]
        self._free.extend(reversed(table))
        return True

    def _check(self, seq_id: Hashable) -> Hashable:
        if seq_id not in self._tables:
            raise UnknownSequence(seq_id)
        return seq_id
