"""The Engine contract on the paged engine: outputs, capacity, exhaustion, bad input, threads."""

from __future__ import annotations

import threading

import pytest
import torch
from transformers import AutoTokenizer

from tokenrouter.engine.base import KVCacheExhausted, StepRow, UnknownSequence


@pytest.fixture
def engine(tiny_pair, make_engine):
    return make_engine(tiny_pair["small"], block_size=4, kv_cache_tokens=64)  # 16 blocks


def test_shape_facts(engine, tiny_pair):
    tokenizer = AutoTokenizer.from_pretrained(tiny_pair["small"])
    assert engine.eos_token_ids == {tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
    assert (engine.vocab_size, engine.hidden_size, engine.max_model_len) == (4096, 64, 4096)
    assert (engine.block_size, engine.num_total_blocks, engine.num_free_blocks) == (4, 16, 16)
    assert engine.can_fit(64) and not engine.can_fit(65)


def test_hidden_and_top_logits(engine, hf_model, tiny_pair):
    prompts = {"x": [5, 6, 7, 8, 9], "y": [10, 11]}
    for seq_id in prompts:
        engine.add_sequence(seq_id)
    result = engine.step([StepRow(k, v) for k, v in prompts.items()], return_hidden=True, top_logits=3)
    model = hf_model(tiny_pair["small"])
    with torch.no_grad():
        for row, tokens in enumerate(prompts.values()):
            expected = model.model(torch.tensor([tokens])).last_hidden_state[0, -1]
            torch.testing.assert_close(result.hidden[row], expected, atol=1e-4, rtol=1e-4)
    top = torch.topk(result.logits, 3)
    assert torch.equal(result.topk_values, top.values) and torch.equal(result.topk_indices, top.indices)
    assert torch.equal(result.sampled, top.indices[:, 0])
    assert result.logits.dtype == torch.float32 and result.logits.shape == (2, engine.vocab_size)
    assert engine.step([StepRow("x", [1])]).hidden is None


def test_exhaustion_is_reported_and_changes_nothing(engine):
    engine.add_sequence("big")
    engine.step([StepRow("big", list(range(3, 3 + 50)))])  # 13 of 16 blocks
    engine.add_sequence("new")
    with pytest.raises(KVCacheExhausted):
        engine.step([StepRow("big", [60]), StepRow("new", list(range(100, 116)))])  # needs 4 more
    assert engine.num_cached("big") == 50 and engine.num_cached("new") == 0
    assert engine.num_free_blocks == 3
    # The refused step left no trace: the same decode now gives what a clean engine gives.
    after = engine.step([StepRow("big", [60])])
    engine.release("big")
    engine.add_sequence("clean")
    clean = engine.step([StepRow("clean", list(range(3, 3 + 50)) + [60])])
    assert after.sampled.tolist() == clean.sampled.tolist()
    torch.testing.assert_close(after.logits, clean.logits, atol=1e-4, rtol=1e-4)
    assert engine.release("clean") and engine.release("new")
    assert engine.num_used_blocks == 0


@pytest.mark.parametrize(
    "rows,error",
    [
        ([], ValueError),
        ([StepRow("a", [])], ValueError),
        ([StepRow("a", [5]), StepRow("a", [6])], ValueError),
        ([StepRow("a", [5]), StepRow("ghost", [6])], UnknownSequence),
        ([StepRow("a", [4096])], ValueError),
        ([StepRow("a", [-1])], ValueError),
    ],
    ids=["no-rows", "empty-row", "duplicate", "unknown", "token-too-big", "negative-token"],
)
def test_bad_steps_raise_and_change_nothing(engine, rows, error):
    engine.add_sequence("a")
    engine.step([StepRow("a", [7, 8, 9])])
    with pytest.raises(error):
        engine.step(rows)
    assert engine.num_cached("a") == 3 and engine.num_used_blocks == 1


def test_max_model_len_is_enforced(tiny_pair, make_engine):
    engine = make_engine(tiny_pair["small"], block_size=64, kv_cache_tokens=8192)
    engine.add_sequence("long")
    with pytest.raises(ValueError, match="max_model_len"):
        engine.step([StepRow("long", [5] * (engine.max_model_len + 1))])
    assert engine.num_cached("long") == 0 and engine.num_used_blocks == 0


def test_threads_are_set_in_the_stepping_thread(tiny_pair, make_engine):
    engine = make_engine(tiny_pair["small"], threads=1)
    engine.add_sequence("a")
    seen = []

    def stepper() -> None:
        torch.set_num_threads(2)
        engine.step([StepRow("a", [5, 6])])
        seen.append(torch.get_num_threads())

    thread = threading.Thread(target=stepper)
    thread.start()
    thread.join()
    assert seen == [1]
