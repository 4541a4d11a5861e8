"""The TensorRT-LLM adapter: what runs without TensorRT-LLM here, and one GPU test against the real thing.

On CPU the adapter's engine class is driven with full-recompute logits sources (the simulated
model's reference, transformers without a cache): exactly what TensorRT-LLM returns for a
whole-context request. Those tests check the emulation itself: that stepping whole contexts, with
pending, extended, released and re-added sequences, gives the other engines' tokens. The GPU test
(``-m gpu``, NGC -trtllm-python-py3 image) runs the same script on a real TensorRT-LLM engine.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Sequence

import pytest
import torch
from transformers import AutoTokenizer

from tokenrouter.config import ModelSpec
from tokenrouter.engine.base import Engine, KVCacheExhausted, SamplingParams, StepRow, UnknownSequence
from tokenrouter.engine.factory import create_engine
from tokenrouter.engine.simulated import SimulatedEngine
from tokenrouter.engine.tensorrt_llm import (
    CACHE_ENV,
    ContextBook,
    EngineLayout,
    HiddenStatesUnavailable,
    NextTokenRequest,
    TensorRTLLMEngine,
    TensorRTLLMUnavailable,
    build_settings,
    engine_cache_dir,
    first_token_logits,
    is_engine_dir,
    read_eos_ids,
    step_result,
)
from tokenrouter.engine.torch_engine import TorchEngine
from tokenrouter.policies import registered_policies
from tokenrouter.runtime.reference import hf_full_recompute

HAS_TRTLLM = importlib.util.find_spec("tensorrt_llm") is not None


# --- a script of steps, run the same way on any engine ---------------------------------------------
PROMPTS = {"a": [5, 9, 33, 71, 2, 18, 44, 90, 7, 12, 61, 3, 27, 81, 15, 40, 66, 8, 23, 50],
           "b": [11, 4, 95, 37, 60, 2, 19, 73, 28, 6, 88, 41, 13, 57, 30, 9, 77, 21, 64, 35, 47, 10, 83]}
PROMPTS["c"] = PROMPTS["a"][:16] + [99, 98]  # shares a's first blocks after a is gone
FOREIGN = [17, 29, 31]  # tokens "the other model" wrote while b was pending
# One dict per step: sequence -> what it does. b sits out steps 2-4, then catches up with an extend.
SCRIPT: list[dict[str, str]] = [
    {"a": "prefill", "b": "prefill"},
    {"a": "decode", "b": "decode"},
    {"a": "decode"},
    {"a": "decode"},
    {"a": "decode"},
    {"a": "decode", "b": "extend"},
    {"b": "decode"},
    {"a": "release", "c": "prefill", "b": "decode"},
    {"b": "decode", "c": "decode"},
    {"b": "decode", "c": "decode"},
]


def run_script(engine: Engine, sampling: dict[str, SamplingParams] | None = None) -> dict[str, list[tuple[int, int]]]:
    """Every sequence's (position, sampled token) in order; each sequence feeds back its own tokens."""
    sampling = sampling or {}
    out: dict[str, list[tuple[int, int]]] = {}
    last: dict[str, int] = {}
    for step in SCRIPT:
        rows = []
        for seq, action in step.items():
            if action == "release":
                assert engine.release(seq) and not engine.has_sequence(seq)
                continue
            if action == "prefill":
                engine.add_sequence(seq)
            new = {"prefill": PROMPTS.get(seq), "decode": [last.get(seq)], "extend": [last.get(seq)] + FOREIGN}[action]
            rows.append(StepRow(seq, new, sampling.get(seq, SamplingParams())))
        result = engine.step(rows)
        for row, token, position in zip(rows, result.sampled.tolist(), result.positions.tolist()):
            last[row.seq_id] = token
            out.setdefault(row.seq_id, []).append((position, token))
    for seq in list(engine.sequence_ids()):
        engine.release(seq)
    assert engine.num_used_blocks == 0
    return out


class SimulatedSource:
    """Whole-context logits from the simulated model's reference (exactly its step logits)."""

    def __init__(self, model: SimulatedEngine) -> None:
        self.model = model

    def next_token_logits(self, requests: Sequence[NextTokenRequest]) -> torch.Tensor:
        return torch.stack([self.model.reference_logits(r.tokens) for r in requests])

    def close(self) -> None:
        pass


class TransformersSource:
    """Whole-context logits from transformers without a cache: what TensorRT-LLM computes per request."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.forward = hf_full_recompute(model)

    def next_token_logits(self, requests: Sequence[NextTokenRequest]) -> torch.Tensor:
        return torch.stack([self.forward(list(r.tokens))[0] for r in requests])

    def close(self) -> None:
        pass


def layout(vocab_size: int, hidden_size: int, block_size: int, max_seq_len: int = 4096) -> EngineLayout:
    return EngineLayout(architecture="LlamaForCausalLM", dtype="float16", vocab_size=vocab_size,
                        hidden_size=hidden_size, max_input_len=max_seq_len - 1, max_seq_len=max_seq_len,
                        tokens_per_block=block_size, gather_generation_logits=True, paged_context_fmha=True)


def sim_pair(block_size: int = 4, kv_cache_tokens: int = 256) -> tuple[SimulatedEngine, TensorRTLLMEngine]:
    sim = SimulatedEngine("m", {"base": "tiny-cpu-small", "time_scale": 0.0}, block_size=block_size,
                          kv_cache_tokens=kv_cache_tokens)
    adapter = TensorRTLLMEngine("m", SimulatedSource(SimulatedEngine("m", {"base": "tiny-cpu-small"})),
                                layout(sim.vocab_size, sim.hidden_size, block_size, sim.max_model_len + 1),
                                sim.eos_token_ids, num_blocks=kv_cache_tokens // block_size, block_size=block_size)
    return sim, adapter


# --- without the package ---------------------------------------------------------------------------
@pytest.mark.skipif(HAS_TRTLLM, reason="tensorrt_llm is installed here")
def test_create_engine_without_the_package_says_what_to_do(tmp_path: Path) -> None:
    spec = ModelSpec(engine="tensorrt_llm", path=str(tmp_path), device="cuda", dtype="float16")
    with pytest.raises(TensorRTLLMUnavailable) as err:
        create_engine("m", spec)
    message = str(err.value)
    assert message.startswith("engine 'tensorrt_llm' needs the tensorrt_llm package (the NGC -trtllm-python-py3 image")
    assert "install" in message and "or use engine: torch" in message
    assert isinstance(err.value, ImportError)


# --- the emulation, end to end on CPU --------------------------------------------------------------
def test_whole_context_requests_give_the_simulated_engines_tokens_greedy_and_sampled() -> None:
    sampling = {"a": SamplingParams(temperature=0.9, top_p=0.95, seed=7), "c": SamplingParams(temperature=1.3, seed=3)}
    sim, adapter = sim_pair()
    expected = run_script(sim, sampling)
    assert run_script(adapter, sampling) == expected
    # Positions are the context lengths: b's extend of 1 + 3 tokens lands 4 further on.
    assert [p for p, _ in expected["b"]][:3] == [23, 24, 28]


def test_whole_context_requests_give_the_paged_torch_engines_greedy_tokens(tiny_pair, make_engine, hf_model) -> None:
    torch_engine = make_engine(tiny_pair["small"], block_size=4, kv_cache_tokens=256)
    config = hf_model(tiny_pair["small"]).config
    adapter = TensorRTLLMEngine("m", TransformersSource(hf_model(tiny_pair["small"])),
                                layout(config.vocab_size, config.hidden_size, 4), read_eos_ids(tiny_pair["small"]),
                                num_blocks=64, block_size=4)
    assert run_script(adapter) == run_script(torch_engine)


def test_step_logits_and_top_k_are_the_sources(tiny_pair, hf_model) -> None:
    model = hf_model(tiny_pair["small"])
    adapter = TensorRTLLMEngine("m", TransformersSource(model), layout(4096, 64, 4), frozenset({1}),
                                num_blocks=16, block_size=4)
    adapter.add_sequence("x")
    adapter.step([StepRow("x", [5, 6, 7])])
    result = adapter.step([StepRow("x", [8, 9])], top_logits=3)
    with torch.no_grad():
        expected = model(torch.tensor([[5, 6, 7, 8, 9]])).logits[0, -1]
    torch.testing.assert_close(result.logits[0], expected, atol=1e-5, rtol=1e-5)
    top = torch.topk(expected, 3)
    assert result.topk_indices[0].tolist() == top.indices.tolist()
    assert result.positions.tolist() == [5] and adapter.num_cached("x") == 5


def test_a_failed_forward_changes_nothing(tiny_pair, hf_model) -> None:
    # The layout claims a larger vocabulary than the model's, so token 4500 passes validation and
    # then really fails in the forward, as an executor error would after blocks were reserved.
    adapter = TensorRTLLMEngine("m", TransformersSource(hf_model(tiny_pair["small"])), layout(5000, 64, 4),
                                frozenset({1}), num_blocks=16, block_size=4)
    adapter.add_sequence("x")
    adapter.step([StepRow("x", [5, 6, 7])])
    with pytest.raises(IndexError):
        adapter.step([StepRow("x", [8, 4500])])
    assert adapter.num_cached("x") == 3 and adapter.num_used_blocks == 1
    again = adapter.step([StepRow("x", [8])])
    assert again.positions.tolist() == [4] and adapter.num_used_blocks == 1


def test_hidden_states_are_refused_by_name_before_anything_changes() -> None:
    _, adapter = sim_pair()
    adapter.add_sequence("a")
    with pytest.raises(HiddenStatesUnavailable) as err:
        adapter.step([StepRow("a", [1, 2])], return_hidden=True)
    needing = {name for name, cls in registered_policies().items() if cls.needs_hidden}
    assert needing == {"citer", "co_llm", "r2r"}  # query_level asks only in classifier mode
    for name in needing | {"query_level (mode: classifier)"}:
        assert name in str(err.value)
    assert "engine: torch" in str(err.value)
    assert adapter.num_cached("a") == 0 and adapter.num_used_blocks == 0


# --- bookkeeping -------------------------------------------------------------------------------------
def test_requests_carry_whole_contexts_for_prefill_extend_and_decode() -> None:
    book = ContextBook(num_blocks=16, block_size=4, vocab_size=100, max_model_len=64)
    book.add("p")
    book.add("q")
    first = book.begin([StepRow("p", [1, 2, 3]), StepRow("q", [4])], top_logits=0)
    assert [(r.tokens, r.start, r.position) for r in first] == [((1, 2, 3), 0, 3), ((4,), 0, 1)]
    book.commit(first)
    extend = book.begin([StepRow("p", [7, 8])], top_logits=0)  # q is pending
    assert extend[0].tokens == (1, 2, 3, 7, 8) and extend[0].position == 5
    book.commit(extend)
    decode = book.begin([StepRow("q", [9]), StepRow("p", [10])], top_logits=0)
    assert [r.tokens for r in decode] == [(4, 9), (1, 2, 3, 7, 8, 10)]
    assert book.pool.num_used == 3  # ceil(6/4) + ceil(2/4): counted like every other engine


def test_exhaustion_and_a_failed_run_leave_no_trace() -> None:
    book = ContextBook(num_blocks=4, block_size=4, vocab_size=100, max_model_len=64)
    book.add("big")
    book.commit(book.begin([StepRow("big", list(range(10)))], top_logits=0))  # 3 blocks
    book.add("new")
    with pytest.raises(KVCacheExhausted):
        book.begin([StepRow("big", [1]), StepRow("new", [1, 2, 3, 4, 5])], top_logits=0)
    assert (len(book.context("big")), len(book.context("new")), book.pool.num_free) == (10, 0, 1)
    requests = book.begin([StepRow("big", [1, 2, 3])], top_logits=0)  # 13 tokens: a 4th block
    assert book.pool.num_free == 0
    book.abort(requests)  # what step does when TensorRT-LLM fails
    assert (len(book.context("big")), book.pool.num_free, book.pool.length("big")) == (10, 1, 10)


@pytest.mark.parametrize(
    "rows,top_logits,error",
    [
        ([], 0, ValueError),
        ([StepRow("a", [])], 0, ValueError),
        ([StepRow("a", [5]), StepRow("a", [6])], 0, ValueError),
        ([StepRow("a", [5]), StepRow("ghost", [6])], 0, UnknownSequence),
        ([StepRow("a", [100])], 0, ValueError),
        ([StepRow("a", [-1])], 0, ValueError),
        ([StepRow("a", [1.5])], 0, ValueError),
        ([StepRow("a", [1] * 62)], 0, ValueError),
        ([StepRow("a", [5])], 101, ValueError),
    ],
    ids=["no-rows", "empty-row", "duplicate", "unknown", "token-too-big", "negative", "float", "too-long", "top-k"],
)
def test_bad_steps_raise_and_change_nothing(rows: list[StepRow], top_logits: int, error: type) -> None:
    book = ContextBook(num_blocks=16, block_size=4, vocab_size=100, max_model_len=64)
    book.add("a")
    book.commit(book.begin([StepRow("a", [7, 8, 9])], top_logits=0))
    with pytest.raises(error):
        book.begin(rows, top_logits)
    assert book.context("a") == (7, 8, 9) and book.pool.num_used == 1


def test_release_drops_the_context_and_the_blocks() -> None:
    _, adapter = sim_pair(kv_cache_tokens=32)
    adapter.add_sequence("a")
    adapter.step([StepRow("a", list(range(10)))])
    assert (adapter.num_free_blocks, adapter.sequence_ids()) == (5, ["a"])
    assert adapter.release("a") and not adapter.release("a")
    assert adapter.num_free_blocks == 8 and not adapter.has_sequence("a")
    with pytest.raises(UnknownSequence):
        adapter.num_cached("a")
    adapter.add_sequence("a")  # the id may come back: it starts empty
    assert adapter.num_cached("a") == 0 and adapter.can_fit(32) and not adapter.can_fit(33)


# --- logits to results -----------------------------------------------------------------------------
def test_sampling_depends_on_seed_and_position_only() -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 3
    params = SamplingParams(temperature=1.0, seed=11)
    rows = [StepRow(s, [1], params) for s in "xyz"]
    alone = step_result(rows[:1], [NextTokenRequest("x", (1,) * 9, 8)], logits[:1], 0)
    batch = step_result(rows, [NextTokenRequest(s, (1,) * n, 0) for s, n in zip("xyz", (9, 4, 30))], logits, 2)
    assert alone.sampled[0] == batch.sampled[0] and batch.positions.tolist() == [9, 4, 30]
    draws = {int(step_result(rows[:1], [NextTokenRequest("x", (1,) * n, 0)], logits[:1], 0).sampled[0])
             for n in range(1, 40)}
    assert len(draws) > 3  # another position, another draw
    greedy = step_result([StepRow("g", [1])], [NextTokenRequest("g", (1,), 0)], logits[:1], 0)
    assert greedy.sampled.tolist() == [int(logits[0].argmax())]
    assert torch.equal(batch.topk_indices, torch.topk(logits, 2).indices) and batch.logits is logits


@pytest.mark.parametrize("shape", [(1, 1, 4099), (1, 4096), (4096,)], ids=["beam-token-padded", "token", "flat"])
def test_first_token_logits_takes_the_one_token_as_float32(shape: tuple[int, ...]) -> None:
    raw = torch.zeros(shape, dtype=torch.float16)
    raw[..., 4095] = 2.5
    logits = first_token_logits(raw, 4096)
    assert logits.dtype == torch.float32 and logits.shape == (4096,) and logits[-1] == 2.5 and logits.sum() == 2.5


def test_first_token_logits_refuses_a_short_vocabulary() -> None:
    with pytest.raises(RuntimeError, match="logits over 100 tokens, expected 4096"):
        first_token_logits(torch.zeros(1, 1, 100), 4096)


# --- engine directories -----------------------------------------------------------------------------
def engine_config(**build_overrides: object) -> dict:
    """An engine config.json as TensorRT-LLM 0.14's Engine.save writes it (the keys the adapter reads)."""
    build = {"max_input_len": 4095, "max_seq_len": 4096, "max_batch_size": 16, "max_num_tokens": 4352,
             "gather_context_logits": False, "gather_generation_logits": True,
             "plugin_config": {"tokens_per_block": 16, "use_paged_context_fmha": True, "paged_kv_cache": True}}
    build.update(build_overrides)
    return {"version": "0.14.0", "build_config": build,
            "pretrained_config": {"architecture": "LlamaForCausalLM", "dtype": "float16", "vocab_size": 4096,
                                  "hidden_size": 64, "max_position_embeddings": 4096}}


def test_engine_layout_reads_an_engine_directory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(engine_config()))
    found = EngineLayout.read(tmp_path)
    assert found == layout(4096, 64, 16)
    assert found.max_model_len == 4095
    found.check("m", ModelSpec(engine="tensorrt_llm", path=str(tmp_path), dtype="float16", block_size=16))


def test_engine_layout_names_every_problem_at_once() -> None:
    bad = EngineLayout.from_config(engine_config(gather_generation_logits=False, plugin_config={}))
    with pytest.raises(ValueError) as err:
        bad.check("m", ModelSpec(engine="tensorrt_llm", path="x", block_size=16))
    message = str(err.value)
    for part in ("blocks hold 64 tokens but block_size is 16", "set block_size: 64", "gather_generation_logits",
                 "use_paged_context_fmha", "dtype is float16 but the spec says float32"):
        assert part in message


def test_engine_or_checkpoint_directory(tmp_path: Path, tiny_pair) -> None:
    (tmp_path / "config.json").write_text(json.dumps(engine_config()))
    assert is_engine_dir(tmp_path) and not is_engine_dir(tiny_pair["small"])
    with pytest.raises(ValueError, match="engine directory or an HF checkpoint directory"):
        is_engine_dir(tmp_path / "model.gguf")


def test_eos_ids_come_from_generation_config(tmp_path: Path, tiny_pair) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_pair["small"])
    expected = {tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
    assert read_eos_ids(tiny_pair["small"]) == expected
    with pytest.raises(ValueError, match="no generation_config.json"):
        read_eos_ids(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 7}))
    assert read_eos_ids(tmp_path) == {7}


def test_build_settings_leave_room_for_a_block_per_row(tiny_pair) -> None:
    hf_config = json.loads((tiny_pair["small"] / "config.json").read_text())
    spec = ModelSpec(engine="tensorrt_llm", path="x", block_size=16, max_batch_size=8, max_prefill_tokens=1024)
    assert build_settings(hf_config, spec) == {"max_batch_size": 8, "max_seq_len": 4096, "max_input_len": 4095,
                                               "max_num_tokens": 1024 + 8 * 16}
    odd = spec.model_copy(update={"max_prefill_tokens": 1000})
    assert build_settings(hf_config, odd)["max_num_tokens"] == 1136  # 1000 + 128, up to whole blocks


def test_engine_cache_dir_changes_with_every_build_input(tmp_path: Path, tiny_pair, monkeypatch) -> None:
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    for name in ("config.json", "model.safetensors"):
        (checkpoint / name).write_bytes((tiny_pair["small"] / name).read_bytes())
    spec = ModelSpec(engine="tensorrt_llm", path=str(checkpoint), dtype="float16", block_size=16)
    root = tmp_path / "cache"
    first = engine_cache_dir(checkpoint, spec, "0.14.0", root)
    assert first == engine_cache_dir(checkpoint, spec, "0.14.0", root) and first.parent == root
    others = {
        engine_cache_dir(checkpoint, spec.model_copy(update={"dtype": "bfloat16"}), "0.14.0", root),
        engine_cache_dir(checkpoint, spec.model_copy(update={"block_size": 32}), "0.14.0", root),
        engine_cache_dir(checkpoint, spec.model_copy(update={"max_batch_size": 4}), "0.14.0", root),
        engine_cache_dir(checkpoint, spec, "0.15.0", root),
    }
    (checkpoint / "model.safetensors").write_bytes(b"other weights")
    others.add(engine_cache_dir(checkpoint, spec, "0.14.0", root))
    assert first not in others and len(others) == 5
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "env"))
    assert engine_cache_dir(checkpoint, spec, "0.14.0").parent == tmp_path / "env"


# --- on a GPU with TensorRT-LLM (the NGC -trtllm-python-py3 image) -------------------------------------
@pytest.mark.gpu
def test_greedy_tokens_equal_the_torch_engine_on_tensorrt_llm(tiny_pair_factory, tmp_path, monkeypatch) -> None:
    """Builds an engine from the checkpoint, runs the script on TensorRT-LLM and on the torch engine.

    TOKENROUTER_TRTLLM_TEST_MODEL may name another HF checkpoint (Llama or Qwen2) than the tiny Llama.
    """
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "engines"))
    path = os.environ.get("TOKENROUTER_TRTLLM_TEST_MODEL") or str(tiny_pair_factory("llama", 0)["small"])
    common = dict(path=path, device="cuda", block_size=16, kv_cache_tokens=4096)
    adapter = create_engine("trt", ModelSpec(engine="tensorrt_llm", dtype="float16", **common))
    reference = TorchEngine.from_spec("torch", ModelSpec(engine="torch", dtype="float32", **common))
    try:
        assert (adapter.vocab_size, adapter.eos_token_ids) == (reference.vocab_size, reference.eos_token_ids)
        assert run_script(adapter) == run_script(reference)
        # The premise of the emulation: later requests found their sequence's earlier blocks.
        assert any(stats.kv_cache_stats.reused_blocks > 0 for stats in adapter.source.iteration_stats())
    finally:
        adapter.close()
        reference.close()
