"""The vLLM engine against the engine contract and its oracles.

- greedy tokens and logits equal transformers ``generate`` (the same scenario as the torch engine:
  mixed prefills, requests away for steps, a late arrival, extends with foreign tokens), on every
  tiny family;
- a pending sequence keeps its very blocks while others run, and resuming it makes vLLM compute
  only the new tokens (vLLM's own scheduled and computed token counts, not time);
- KV blocks balance to zero after finish, cancel (release mid-run) and failed steps;
- exhaustion and bad steps raise before anything changes; sampling follows the returned logits.

The qwen3 engines are shared by the session (see tests/conftest.py): each test releases what it adds.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from oracle_scenario import assert_matches_reference, random_prompts, scenario

from tokenrouter.config import ModelSpec
from tokenrouter.engine.base import KVCacheExhausted, SamplingParams, StepRow, UnknownSequence
from tokenrouter.engine.dtypes import cpu_has_fast_bf16
from tokenrouter.engine.factory import create_engine
from tokenrouter.engine.sampling import sample_tokens


@pytest.fixture(params=["small", "large"])
def engine(request, vllm_tiny_engines):
    engine = vllm_tiny_engines[request.param]
    assert engine.sequence_ids() == [], "a previous test leaked sequences"
    yield engine
    for seq_id in engine.sequence_ids():
        engine.release(seq_id)
    assert engine.num_free_blocks == engine.num_total_blocks


def test_greedy_equals_generate(engine, tiny_pair, hf_model, reference):
    size = "small" if engine.name == "small" else "large"
    requests = scenario(engine, random_prompts(seed=7, vocab=engine.vocab_size))
    assert_matches_reference(requests, hf_model(tiny_pair[size]), reference, atol=1e-3, label=f"vllm {size}")


def test_other_families_greedy_equal_generate(tiny_pair_factory, hf_model, reference):
    """Each family's vLLM model definition and weight mapping, not only qwen3's."""
    families = ("qwen2", "llama")
    paths = {family: tiny_pair_factory(family, 0)["small"] for family in families}

    def start(family: str):
        return create_engine(family, ModelSpec(path=str(paths[family]), engine="vllm", dtype="float32",
                                               kv_cache_tokens=2048, threads=1))

    with ThreadPoolExecutor(len(families)) as pool:
        engines = dict(zip(families, pool.map(start, families)))
    try:
        for family, engine in engines.items():
            requests = scenario(engine, random_prompts(seed=11, vocab=engine.vocab_size))
            assert_matches_reference(requests, hf_model(paths[family]), reference, atol=1e-3, label=family)
    finally:
        for engine in engines.values():
            engine.close()


def test_shape_facts_follow_the_spec(vllm_tiny_engines, tiny_pair):
    small = vllm_tiny_engines["small"]
    assert (small.vocab_size, small.hidden_size, small.block_size) == (4096, 64, 32)
    assert small.num_total_blocks == 8192 // 32  # exactly the spec's pool: admission and engine agree
    assert small.eos_token_ids == frozenset({0, 2})


def test_pending_keeps_its_blocks_and_resume_computes_only_new_tokens(vllm_tiny_engines):
    engine = vllm_tiny_engines["small"]
    engine.add_sequence("away")
    engine.step([StepRow("away", list(range(3, 83)))])  # 80-token prefill, then it goes pending
    blocks = engine.call("block_ids", "away")
    assert engine.call("computed_tokens", "away") == 80 and len(blocks) == 3
    # Others come and go, allocating and freeing blocks, for many steps.
    for wave in range(3):
        ids = [f"busy{wave}-{i}" for i in range(4)]
        for seq_id in ids:
            engine.add_sequence(seq_id)
        engine.step([StepRow(seq_id, list(range(100 + wave, 160 + wave))) for seq_id in ids])
        for token in range(5):
            engine.step([StepRow(seq_id, [token + 7]) for seq_id in ids])
        for seq_id in ids:
            assert set(engine.call("block_ids", seq_id)).isdisjoint(blocks), "a pending request's block was reused"
            engine.release(seq_id)
        assert engine.call("block_ids", "away") == blocks
        assert engine.call("computed_tokens", "away") == 80
    for k in (1, 3, 4):
        before = engine.num_cached("away")
        engine.step([StepRow("away", [9] * k)])
        assert engine.call("last_step_tokens") == {"away": k}, "resume recomputed more than its new tokens"
        assert engine.call("computed_tokens", "away") == before + k
    engine.release("away")


def test_blocks_balance_after_finish_cancel_and_failed_steps(vllm_tiny_engines):
    engine = vllm_tiny_engines["large"]
    for seq_id in "abcd":
        engine.add_sequence(seq_id)
    engine.step([StepRow(s, list(range(5, 5 + 20 * (i + 1)))) for i, s in enumerate("abcd")])
    engine.step([StepRow(s, [11]) for s in "abcd"])
    assert engine.release("b")  # cancelled mid-run
    with pytest.raises(ValueError):  # token out of the vocabulary: refused before anything runs
        engine.step([StepRow("a", [7]), StepRow("c", [engine.vocab_size])])
    engine.step([StepRow("a", [7]), StepRow("c", [8])])  # both still whole after the refused step
    assert engine.num_cached("a") == 22 and engine.num_cached("c") == 62
    for seq_id in "acd":  # finished
        engine.release(seq_id)
    assert engine.num_free_blocks == engine.num_total_blocks


def test_exhaustion_is_reported_and_changes_nothing(tiny_pair):
    """Also the engine of ``dtype: auto``: bfloat16 where this CPU has AMX or AVX-512 BF16."""
    engine = create_engine("tight", ModelSpec(path=str(tiny_pair["small"]), engine="vllm", kv_cache_tokens=128,
                                              threads=1))
    try:
        assert engine.call("dtype") == (torch.bfloat16 if cpu_has_fast_bf16() else torch.float32)
        assert engine.num_total_blocks == 4
        engine.add_sequence("a")
        engine.add_sequence("b")
        engine.step([StepRow("a", list(range(3, 70)))])  # 3 blocks
        with pytest.raises(KVCacheExhausted):
            engine.step([StepRow("a", [5]), StepRow("b", list(range(3, 40)))])  # b needs 2, 1 free
        assert engine.num_cached("a") == 67 and engine.num_cached("b") == 0 and engine.num_free_blocks == 1
        result = engine.step([StepRow("a", [5])])  # a is untouched and goes on
        assert result.positions.tolist() == [68]
    finally:
        engine.close()


@pytest.mark.parametrize("rows,error", [
    ([], ValueError),
    ([StepRow("ghost", [1])], UnknownSequence),
    ([StepRow("a", [])], ValueError),
    ([StepRow("a", [1]), StepRow("a", [2])], ValueError),
    ([StepRow("a", [-1])], ValueError),
])
def test_bad_steps_raise_and_change_nothing(vllm_tiny_engines, rows, error):
    engine = vllm_tiny_engines["small"]
    engine.add_sequence("a")
    engine.step([StepRow("a", [3, 4, 5])])
    used = engine.num_total_blocks - engine.num_free_blocks
    with pytest.raises(error):
        engine.step(rows)
    assert engine.num_cached("a") == 3 and engine.num_total_blocks - engine.num_free_blocks == used
    assert engine.step([StepRow("a", [6])]).positions.tolist() == [4]
    engine.release("a")


def test_signals_and_sampling_follow_the_returned_logits(vllm_tiny_engines, tiny_pair, make_engine):
    """Top-k are the logits' top-k, hidden states are the final-norm states the torch engine
    gives, and sampled tokens are our reproducible sampler's on the returned logits."""
    engine = vllm_tiny_engines["small"]
    oracle = make_engine(tiny_pair["small"], block_size=4)
    sampling = SamplingParams(temperature=0.9, top_p=0.95, seed=3)
    rows = [StepRow("a", list(range(3, 30)), sampling), StepRow("b", [7, 8, 9])]
    for target in (engine, oracle):
        target.add_sequence("a")
        target.add_sequence("b")
    ours = engine.step(rows, return_hidden=True, top_logits=8)
    theirs = oracle.step(rows, return_hidden=True)
    torch.testing.assert_close(ours.hidden, theirs.hidden, atol=1e-3, rtol=1e-4)
    top = torch.topk(ours.logits, 8, dim=-1)
    torch.testing.assert_close(ours.topk_values, top.values)
    assert torch.equal(ours.topk_indices, top.indices)
    expected = sample_tokens(ours.logits, [row.sampling for row in rows], ours.positions.tolist())
    assert torch.equal(ours.sampled, expected)
    assert ours.sampled[1] == int(ours.logits[1].argmax())  # the greedy row
    engine.release("a")
    engine.release("b")


def test_a_vllm_without_what_the_adapter_uses_is_refused_at_start_by_name(monkeypatch) -> None:
    """Checked by capability: the installed vLLM passes; one without the engine core's add step,
    an engine argument, or with a new required request field is refused before any engine is
    built, naming what it lacks and the supported range."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.engine.core import EngineCore

    from tokenrouter.engine.vllm_compat import SUPPORTED_VLLM, UnsupportedVLLM, require_vllm_capabilities

    require_vllm_capabilities()
    range_named = re.escape(f"supported: {SUPPORTED_VLLM}")
    with monkeypatch.context() as patch:
        patch.delattr(EngineCore, "preprocess_add_request")
        with pytest.raises(UnsupportedVLLM, match=rf"lacks EngineCore.preprocess_add_request: .*{range_named}"):
            require_vllm_capabilities()
    with monkeypatch.context() as patch:
        patch.setattr("dataclasses.fields", lambda cls: [f for f in FIELDS(cls) if f.name != "async_scheduling"])
        with pytest.raises(UnsupportedVLLM, match="lacks EngineArgs.async_scheduling"):
            require_vllm_capabilities()
    with monkeypatch.context() as patch:
        fields = ("session_token",) + EngineCoreRequest.__struct_fields__
        newer = type("EngineCoreRequest", (), {"__struct_fields__": fields,
                                                "__struct_defaults__": EngineCoreRequest.__struct_defaults__})
        patch.setattr("vllm.v1.engine.EngineCoreRequest", newer)
        with pytest.raises(UnsupportedVLLM, match=r"EngineCoreRequest.session_token \(required"):
            require_vllm_capabilities()
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "vllm.v1.engine.input_processor", None)  # an older vLLM's layout
        with pytest.raises(UnsupportedVLLM, match=rf"cannot import .*{range_named}"):
            require_vllm_capabilities()
    assert EngineArgs  # imported before the patches: the real class is what was checked


FIELDS = dataclasses.fields


def test_async_scheduling_and_the_model_runner_are_set_not_left_to_vllm(tiny_pair, vllm_tiny_engines) -> None:
    """vLLM's GPU defaults (async scheduling on, the V2 model runner for dense models) would break
    the adapter: both are set explicitly. On CPU vLLM forces async scheduling off and has no V2
    runner, so the started engine cannot tell; what the adapter passes, and what vLLM read from
    the environment, can."""
    from tokenrouter.engine.vllm_compat import vllm_environment
    from tokenrouter.engine.vllm_engine import engine_arguments

    spec = ModelSpec(path=str(tiny_pair["small"]), engine="vllm", device="cuda:0", kv_cache_tokens=4096)
    arguments = engine_arguments(spec, dtype="bfloat16", on_cpu=False, max_position_embeddings=32768)
    assert arguments["async_scheduling"] is False  # not None: None lets vLLM turn it on
    assert arguments["enforce_eager"] is False  # CUDA graphs on on GPU
    assert vllm_environment()["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    # In a started engine's process (the session's, started by the adapter as any other): what
    # vllm.envs read, and what the started engine chose.
    settings = vllm_tiny_engines["small"].call("runner_settings")
    assert {key: settings[key] for key in ("VLLM_USE_V2_MODEL_RUNNER", "async_scheduling", "input_batch")} == {
        "VLLM_USE_V2_MODEL_RUNNER": False, "async_scheduling": False, "input_batch": True}


def test_max_model_len_is_what_whole_blocks_of_the_pool_hold(tiny_pair) -> None:
    """vLLM refuses to start when one request of max_model_len does not fit the pool's whole blocks
    (a pool of 978 tokens in blocks of 32 holds 960)."""
    from tokenrouter.engine.vllm_engine import engine_arguments

    spec = ModelSpec(path=str(tiny_pair["small"]), engine="vllm", kv_cache_tokens=978)
    arguments = engine_arguments(spec, dtype="float32", on_cpu=True, max_position_embeddings=32768)
    assert (arguments["max_model_len"], arguments["num_gpu_blocks_override"]) == (960, 30 + 1)
    assert engine_arguments(spec, dtype="float32", on_cpu=True, max_position_embeddings=512)["max_model_len"] == 512


def test_a_started_engine_that_ignored_the_settings_is_refused() -> None:
    from types import SimpleNamespace

    from tokenrouter.engine.vllm_compat import UnsupportedVLLM, check_started_engine

    sync = SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=False), use_v2_model_runner=False)
    v1_runner = {"runner": "CPUModelRunner", "input_batch": True}  # as the worker extension reports it
    check_started_engine(sync, v1_runner)
    with pytest.raises(UnsupportedVLLM, match=r"\(GPUModelRunnerV2\) has no input_batch"):
        check_started_engine(sync, {"runner": "GPUModelRunnerV2", "input_batch": False})
    with pytest.raises(UnsupportedVLLM, match="schedules asynchronously"):
        check_started_engine(SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=True)), v1_runner)
    with pytest.raises(UnsupportedVLLM, match="V2 model runner"):
        check_started_engine(SimpleNamespace(scheduler_config=sync.scheduler_config, use_v2_model_runner=True),
                             v1_runner)


def test_captured_logits_are_the_rows_vllms_own_sampler_saw(vllm_tiny_engines) -> None:
    """The capture maps each row's logits to its request: vLLM's sampler (its own argmax and
    log-probabilities, computed from the logits it was given) agrees with the captured logits row
    by row, in a step that mixes prefills, decodes and an extend. The device check runs the same
    comparison with CUDA graphs on."""
    engine = vllm_tiny_engines["large"]
    engine.call("record_sampler_logprobs", 5)
    try:
        for seq_id in "abc":
            engine.add_sequence(seq_id)
        engine.step([StepRow("a", list(range(3, 40))), StepRow("b", [9, 10, 11])])
        result = engine.step([StepRow("c", list(range(50, 61))), StepRow("b", [12]), StepRow("a", [7, 8, 9])])
        recorded = engine.call("last_sampler_logprobs")
        assert set(recorded) == {"a", "b", "c"}
        logprobs = torch.log_softmax(result.logits, dim=-1)
        for row, seq_id in enumerate(result.seq_ids):
            sampled, top = recorded[seq_id]
            assert sampled == int(result.logits[row].argmax()) == int(result.sampled[row])
            assert len(top) >= 5
            for token, value in top.items():
                assert abs(float(logprobs[row, token]) - value) < 1e-4, (seq_id, token)
    finally:
        engine.call("record_sampler_logprobs", 0)
        for seq_id in "abc":
            engine.release(seq_id)
