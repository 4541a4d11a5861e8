"""Std. Serving's prefix cache: longest proper prefix wins, content is confirmed, LRU eviction."""

from __future__ import annotations

from tokenrouter_tools.bench.prefix_cache import PrefixCache


def test_longest_proper_prefix_is_taken_and_leaves_the_cache():
    cache = PrefixCache(block_size=4)
    context = list(range(20))
    cache.insert("short", context[:5])
    cache.insert("long", context[:13])
    cache.insert("other", [99] * 13)
    assert cache.take(context) == ("long", 13)
    assert "long" not in cache and len(cache) == 2
    assert cache.take(context) == ("short", 5)
    assert cache.take(context) is None
    assert (cache.stats.lookups, cache.stats.hits, cache.stats.hit_tokens) == (3, 2, 18)


def test_a_whole_context_is_not_a_proper_prefix():
    # a call must feed at least one token to get next-token logits
    cache = PrefixCache(block_size=4)
    cache.insert("same", [1, 2, 3, 4, 5])
    assert cache.take([1, 2, 3, 4, 5]) is None
    assert cache.take([1, 2, 3, 4, 5, 6]) == ("same", 5)


def test_same_blocks_different_tail_is_rejected():
    cache = PrefixCache(block_size=4)
    cache.insert("a", [1, 2, 3, 4, 5, 6])  # same full block as the context, different partial block
    assert cache.take([1, 2, 3, 4, 5, 7, 8]) is None
    assert cache.take([1, 2, 3, 4, 5, 6, 8]) == ("a", 6)


def test_lru_eviction_order_follows_use():
    cache = PrefixCache(block_size=2)
    for name, start in (("a", 10), ("b", 20), ("c", 30)):
        cache.insert(name, [start, start + 1, start + 2])
    seq, length = cache.take([10, 11, 12, 13])  # "a" used again: now the most recent
    cache.insert(seq, [10, 11, 12, 13])
    assert [cache.evict(), cache.evict(), cache.evict(), cache.evict()] == ["b", "c", "a", None]
    assert cache.stats.evictions == 3


def test_clear_returns_everything_without_counting_evictions():
    cache = PrefixCache(block_size=2)
    cache.insert("a", [1, 2, 3])
    cache.insert("b", [4])
    assert sorted(cache.clear()) == ["a", "b"]
    assert len(cache) == 0 and cache.take([1, 2, 3, 4]) is None and cache.stats.evictions == 0
