"""A prefix cache over engine sequences, as a plain serving engine keeps one between calls.

After a call, the sequence that computed it stays in the engine with its KV (the call's whole
context) and goes into this cache, keyed by its token content. A later call whose context starts
with that content takes the sequence over and feeds only the rest. The Engine API has no block
sharing or truncation, so a cached sequence is reusable only when its whole content is a proper
prefix of the new context; that is always the case for the next call of the same conversation
(contexts only grow), which is the reuse that matters here.

Lookup uses a chain of block hashes (hash of block k covers blocks 0..k), so a context is hashed
once per call, and candidates are confirmed token by token (a hash never decides alone). Idle
sequences are evicted least recently used first when the pool needs room.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Hashable, Sequence

SeqId = Hashable


@dataclass
class CacheStats:
    lookups: int = 0
    hits: int = 0
    hit_tokens: int = 0  # context tokens whose KV was reused instead of computed
    evictions: int = 0


class PrefixCache:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._content: OrderedDict[SeqId, tuple[int, ...]] = OrderedDict()  # LRU first
        self._keys: dict[SeqId, tuple[int, int]] = {}
        self._index: dict[tuple[int, int], set[SeqId]] = {}  # (full blocks, chain hash) -> sequences
        self.stats = CacheStats()

    def __len__(self) -> int:
        return len(self._content)

    def __contains__(self, seq_id: SeqId) -> bool:
        return seq_id in self._content

    def chain(self, tokens: Sequence[int], blocks: int) -> list[int]:
        """Hash of the first k full blocks, for k = 0..blocks."""
        hashes, bs = [0], self.block_size
        for k in range(blocks):
            hashes.append(hash((hashes[-1], tuple(tokens[k * bs:(k + 1) * bs]))))
        return hashes

    def insert(self, seq_id: SeqId, tokens: Sequence[int]) -> None:
        """``seq_id`` is idle and holds KV for exactly ``tokens``."""
        content = tuple(tokens)
        blocks = len(content) // self.block_size
        key = (blocks, self.chain(content, blocks)[-1])
        self._content[seq_id], self._keys[seq_id] = content, key
        self._index.setdefault(key, set()).add(seq_id)

    def take(self, tokens: Sequence[int]) -> tuple[SeqId, int] | None:
        """The cached sequence with the longest content that is a proper prefix of ``tokens``, and
        that length; it leaves the cache (the caller owns it until it inserts it again)."""
        self.stats.lookups += 1
        if not tokens:
            return None
        top = (len(tokens) - 1) // self.block_size  # a proper prefix has at most len - 1 tokens
        hashes = self.chain(tokens, top)
        for blocks in range(top, -1, -1):
            best = None
            for seq_id in self._index.get((blocks, hashes[blocks]), ()):
                content = self._content[seq_id]
                if len(content) < len(tokens) and (best is None or len(content) > len(self._content[best])) \
                        and tuple(tokens[:len(content)]) == content:
                    best = seq_id
            if best is not None:
                length = len(self._content[best])
                self.remove(best)
                self.stats.hits += 1
                self.stats.hit_tokens += length
                return best, length
        return None

    def remove(self, seq_id: SeqId) -> None:
        del self._content[seq_id]
        key = self._keys.pop(seq_id)
        self._index[key].discard(seq_id)
        if not self._index[key]:
            del self._index[key]

    def clear(self) -> list[SeqId]:
        """Forget every entry (shutdown, not eviction); returns the sequences to free."""
        seq_ids = list(self._content)
        self._content.clear()
        self._keys.clear()
        self._index.clear()
        return seq_ids

    def evict(self) -> SeqId | None:
        """Drop the least recently used sequence (the caller frees its KV); None when empty."""
        if not self._content:
            return None
        seq_id = next(iter(self._content))
        self.remove(seq_id)
        self.stats.evictions += 1
        return seq_id
