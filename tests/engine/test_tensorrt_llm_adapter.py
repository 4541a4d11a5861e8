"""The TensorRT-LLM adapter (LLM API, PyTorch backend): request construction against TensorRT-LLM's
recorded API, span behaviour, and one GPU test against the real thing.

No TensorRT-LLM here. The CPU tests drive the adapter through a stand-in ``tensorrt_llm`` module whose
classes and methods have exactly the signatures recorded below from TensorRT-LLM's public source, so
a keyword TensorRT-LLM does not have fails here as it would on the GPU. Its requests "generate" by
full recompute on a tiny transformers model, which is what a request over a whole context returns.
The GPU test (``-m gpu``, NGC -trtllm-python-py3 image) runs the same script on a real LLM.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import os
import sys
import types
from collections import namedtuple
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from tokenrouter.config import ModelSpec
from tokenrouter.engine.base import KVCacheExhausted, SamplingParams, StepRow
from tokenrouter.engine.factory import create_engine
from tokenrouter.engine.tensorrt_llm import (
    HIDDEN_STATE_POLICIES,
    LOGPROBS,
    RETENTION_S,
    SPAN_TOKENS,
    HiddenStatesUnavailable,
    TensorRTLLMEngine,
    TensorRTLLMUnavailable,
    kv_cache_arguments,
    llm_arguments,
    span_sampling_arguments,
)
from tokenrouter.policies import registered_policies

HAS_TRTLLM = importlib.util.find_spec("tensorrt_llm") is not None

# --- TensorRT-LLM's API as recorded from its public source (NVIDIA/TensorRT-LLM, 1.x) ----------------
# tensorrt_llm/llmapi/llm.py: LLM.__init__ and LLM.generate_async (parameters in order).
LLM_INIT = ("model", "tokenizer", "tokenizer_mode", "skip_tokenizer_init", "trust_remote_code",
            "tensor_parallel_size", "dtype", "revision", "tokenizer_revision")
GENERATE_ASYNC = ("inputs", "sampling_params", "lora_request", "prompt_adapter_request", "streaming", "queries",
                  "kv_cache_retention_config", "disaggregated_params")
# tensorrt_llm/llmapi/llm_args.py: the LLM keyword arguments (LlmArgs fields) the adapter may pass.
LLM_ARGS = ("kv_cache_config", "max_batch_size", "max_num_tokens", "max_seq_len", "max_beam_width")
# tensorrt_llm/llmapi/llm_args.py: KvCacheConfig fields (StrictBaseModel: unknown fields are errors).
KV_CACHE_CONFIG = ("enable_block_reuse", "max_tokens", "max_attention_window", "free_gpu_memory_fraction")
# tensorrt_llm/sampling_params.py: SamplingParams (dataclass, slots, kw_only) fields.
SAMPLING_PARAMS = (
    "end_id", "pad_id", "max_tokens", "bad", "bad_token_ids", "stop", "stop_token_ids",
    "include_stop_str_in_output", "embedding_bias", "logits_processor", "apply_batched_logits_processor", "n",
    "best_of", "use_beam_search", "top_k", "top_p", "top_p_min", "top_p_reset_ids", "top_p_decay", "seed",
    "temperature", "min_tokens", "beam_search_diversity_rate", "repetition_penalty", "presence_penalty",
    "frequency_penalty", "length_penalty", "early_stopping", "no_repeat_ngram_size", "min_p", "beam_width_array",
    "logprobs", "prompt_logprobs", "return_context_logits", "return_generation_logits",
    "exclude_input_from_output", "return_encoder_output", "return_perf_metrics", "additional_model_outputs",
    "lookahead_config", "guided_decoding", "ignore_eos", "detokenize", "add_special_tokens",
    "truncate_prompt_tokens", "skip_special_tokens", "spaces_between_special_tokens",
)
# cpp/tensorrt_llm/nanobind/executor/request.cpp (1.2.x; the older pybind bindings name them the same),
# exported as tensorrt_llm.llmapi.KvCacheRetentionConfig: constructor parameters in order (required ones
# first), durations as datetime.timedelta (std::chrono::milliseconds), priorities 0..100, default 35.
KV_CACHE_RETENTION_CONFIG = ("token_range_retention_configs", "decode_retention_priority", "decode_duration_ms",
                             "transfer_mode", "directory")
TOKEN_RANGE_RETENTION_CONFIG = ("token_start", "token_end", "priority", "duration_ms")
DEFAULT_RETENTION_PRIORITY = 35
# tensorrt_llm/executor/result.py: GenerationResult (abort(), finished, outputs, __next__ = one response
# step, StopIteration once done); CompletionOutput (token_ids, logprobs, *_diff = what the last response
# added); logprobs are {token id: Logprob(logprob, rank)} per token, the sampled token always included.
Logprob = namedtuple("Logprob", ["logprob", "rank"])


def _keywords_only(function_name: str, allowed: tuple[str, ...], kwargs: dict[str, Any]) -> None:
    unknown = set(kwargs) - set(allowed)
    if unknown:
        raise TypeError(f"{function_name}() got unexpected keyword arguments {sorted(unknown)}")


FakeSamplingParams = dataclasses.make_dataclass(
    "SamplingParams", [(name, Any, dataclasses.field(default=None)) for name in SAMPLING_PARAMS], kw_only=True)


class FakeKvCacheRetentionConfig:
    class TokenRangeRetentionConfig:
        def __init__(self, token_start: int, token_end: int | None, priority: int, duration_ms: Any = None) -> None:
            assert 0 <= priority <= 100 and (duration_ms is None or isinstance(duration_ms, timedelta))
            self.token_start, self.token_end = token_start, token_end
            self.priority, self.duration_ms = priority, duration_ms

    def __init__(self, token_range_retention_configs: list, decode_retention_priority: int = DEFAULT_RETENTION_PRIORITY,
                 decode_duration_ms: Any = None, transfer_mode: Any = "DRAM", directory: Any = None) -> None:
        assert all(isinstance(c, self.TokenRangeRetentionConfig) for c in token_range_retention_configs)
        assert 0 <= decode_retention_priority <= 100
        assert decode_duration_ms is None or isinstance(decode_duration_ms, timedelta)
        self.token_range_retention_configs = list(token_range_retention_configs)
        self.decode_retention_priority, self.decode_duration_ms = decode_retention_priority, decode_duration_ms


class FakeKvCacheConfig:
    def __init__(self, **kwargs: Any) -> None:
        _keywords_only("KvCacheConfig", KV_CACHE_CONFIG, kwargs)
        self.__dict__.update(kwargs)


@dataclasses.dataclass
class FakeOutput:
    token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[dict[int, Logprob]] = dataclasses.field(default_factory=list)
    _last: int = 0

    @property
    def token_ids_diff(self) -> list[int]:
        return self.token_ids[self._last:]

    @property
    def logprobs_diff(self) -> list[dict[int, Logprob]]:
        return self.logprobs[self._last:]


class FakeResult:
    """A streaming request: each ``next`` computes one token over the whole context (full recompute)."""

    def __init__(self, model: Any, prompt: list[int], params: Any) -> None:
        self.model, self.prompt_token_ids, self.sampling_params = model, list(prompt), params
        self.outputs = [FakeOutput()]
        self.finished = self.aborted = False

    def abort(self) -> None:
        self.aborted = self.finished = True

    def __iter__(self) -> "FakeResult":
        return self

    def __next__(self) -> "FakeResult":
        if self.finished:
            raise StopIteration
        output = self.outputs[0]
        output._last = len(output.token_ids)
        with torch.no_grad():
            logits = self.model(torch.tensor([self.prompt_token_ids + output.token_ids])).logits[0, -1].float()
        logprobs = torch.log_softmax(logits, -1)
        assert self.sampling_params.top_k == 1, "the stand-in only decodes greedily"
        token = int(logprobs.argmax())
        top = torch.topk(logprobs, self.sampling_params.logprobs)
        output.token_ids.append(token)
        output.logprobs.append({int(i): Logprob(float(v), rank + 1)
                                for rank, (v, i) in enumerate(zip(top.values, top.indices))})
        self.finished = len(output.token_ids) == self.sampling_params.max_tokens
        return self


class FakeLLM:
    instances: list["FakeLLM"] = []

    def __init__(self, model: Any, tokenizer: Any = None, tokenizer_mode: str = "auto",
                 skip_tokenizer_init: bool = False, trust_remote_code: bool = False, tensor_parallel_size: int = 1,
                 dtype: str = "auto",
                 revision: Any = None, tokenizer_revision: Any = None, **kwargs: Any) -> None:
        _keywords_only("LLM", LLM_ARGS, kwargs)
        self.arguments = {"model": model, "skip_tokenizer_init": skip_tokenizer_init, "dtype": dtype,
                          "tensor_parallel_size": tensor_parallel_size, **kwargs}
        self.reference = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
        self.requests: list[FakeResult] = []
        FakeLLM.instances.append(self)

    def generate_async(self, inputs: Any, sampling_params: Any = None, lora_request: Any = None,
                       prompt_adapter_request: Any = None, streaming: bool = False, queries: Any = None,
                       kv_cache_retention_config: Any = None, disaggregated_params: Any = None) -> FakeResult:
        assert isinstance(inputs, list) and all(isinstance(t, int) for t in inputs), "token ids in"
        assert streaming, "spans stream"
        self.requests.append(FakeResult(self.reference, inputs, sampling_params))
        self.requests[-1].kv_cache_retention_config = kv_cache_retention_config
        return self.requests[-1]

    def shutdown(self) -> None:
        pass


def test_the_stand_in_has_the_recorded_signatures() -> None:
    assert tuple(inspect.signature(FakeLLM.__init__).parameters)[1:-1] == LLM_INIT
    assert tuple(inspect.signature(FakeLLM.generate_async).parameters)[1:] == GENERATE_ASYNC
    assert tuple(f.name for f in dataclasses.fields(FakeSamplingParams)) == SAMPLING_PARAMS
    with pytest.raises(TypeError):
        FakeSamplingParams(max_new_tokens=3)  # the keyword TensorRT-LLM does not have
    assert tuple(inspect.signature(FakeKvCacheRetentionConfig).parameters) == KV_CACHE_RETENTION_CONFIG
    token_range = inspect.signature(FakeKvCacheRetentionConfig.TokenRangeRetentionConfig).parameters
    assert tuple(token_range) == TOKEN_RANGE_RETENTION_CONFIG
    assert [name for name, p in token_range.items() if p.default is p.empty] == ["token_start", "token_end", "priority"]


@pytest.fixture
def fake_tensorrt_llm(monkeypatch) -> types.ModuleType:
    module = types.ModuleType("tensorrt_llm")
    module.LLM, module.SamplingParams = FakeLLM, FakeSamplingParams
    llmapi = types.ModuleType("tensorrt_llm.llmapi")
    llmapi.KvCacheConfig = FakeKvCacheConfig
    llmapi.KvCacheRetentionConfig = FakeKvCacheRetentionConfig
    module.llmapi = llmapi
    monkeypatch.setitem(sys.modules, "tensorrt_llm", module)
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi", llmapi)
    FakeLLM.instances.clear()
    return module


def _spec(path: Path, **overrides: Any) -> ModelSpec:
    return ModelSpec(**{"path": str(path), "engine": "tensorrt_llm", "device": "cuda", "dtype": "bfloat16",
                        "kv_cache_tokens": 1024, "block_size": 16, "max_batch_size": 8, **overrides})


# --- request construction ----------------------------------------------------------------------------
def test_llm_and_kv_cache_arguments(tiny_pair) -> None:
    spec = _spec(tiny_pair["small"], gpu_memory_utilization=0.3)
    kv = kv_cache_arguments(spec)
    assert kv == {"enable_block_reuse": True, "max_tokens": 1024 + 8 * 16, "free_gpu_memory_fraction": 0.3}
    assert set(kv) <= set(KV_CACHE_CONFIG)
    arguments = llm_arguments(spec, "KV")
    assert arguments["skip_tokenizer_init"] is True and arguments["kv_cache_config"] == "KV"
    assert set(arguments) <= set(LLM_INIT) | set(LLM_ARGS)


@pytest.mark.parametrize("sampling, expected", [
    (SamplingParams(), {"top_k": 1}),
    (SamplingParams(temperature=0.7, top_p=0.9, top_k=0, seed=5), {"temperature": 0.7, "top_p": 0.9, "top_k": None}),
])
def test_span_sampling_arguments(sampling: SamplingParams, expected: dict) -> None:
    arguments = span_sampling_arguments(sampling, 12)
    assert arguments == {"max_tokens": 12, "ignore_eos": True, "detokenize": False, "logprobs": LOGPROBS,
                         "seed": sampling.seed, **expected}
    FakeSamplingParams(**arguments)  # every keyword exists in TensorRT-LLM's SamplingParams


def test_span_sampling_arguments_carry_the_logit_processing() -> None:
    """Penalties pass through; bias and the min_tokens ban of the end ids become one embedding
    bias, on a span cut where min_tokens is reached (the next span has no ban)."""
    sampling = SamplingParams(temperature=0.5, repetition_penalty=1.2, frequency_penalty=0.3, min_tokens=6,
                              prompt_len=4, end_ids=(2, 0), logit_bias=((7, 1.5),))
    early = span_sampling_arguments(sampling, 12, generated=2, vocab_size=16)
    assert early["repetition_penalty"] == 1.2 and early["frequency_penalty"] == 0.3
    assert "presence_penalty" not in early and early["max_tokens"] == 4
    expected = torch.zeros(16)
    expected[7], expected[[0, 2]] = 1.5, float("-inf")
    assert torch.equal(early["embedding_bias"], expected)
    late = span_sampling_arguments(sampling, 12, generated=6, vocab_size=16)
    assert late["max_tokens"] == 12 and late["embedding_bias"][[0, 2]].tolist() == [0.0, 0.0]
    FakeSamplingParams(**early)


def test_tensor_parallel_size_maps_to_the_llm_api_and_needs_the_gpus(fake_tensorrt_llm, tiny_pair,
                                                                     monkeypatch) -> None:
    """Mapping only (UNVERIFIED: no TensorRT-LLM here): the LLM API splits the model over the first
    tensor_parallel_size visible GPUs; fewer visible GPUs are refused before the LLM is built."""
    from tokenrouter.engine.ranks import RankPlacementError

    assert llm_arguments(_spec(tiny_pair["small"]), "KV")["tensor_parallel_size"] == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with pytest.raises(RankPlacementError, match="model 'm': tensor_parallel_size 2 on device cuda needs GPUs 0 to 1"):
        create_engine("m", _spec(tiny_pair["small"], tensor_parallel_size=2))
    assert FakeLLM.instances == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    create_engine("m", _spec(tiny_pair["small"], tensor_parallel_size=2)).close()
    assert FakeLLM.instances[0].arguments["tensor_parallel_size"] == 2


@pytest.mark.parametrize("device", ["cpu", "cuda:1"])
def test_devices_the_llm_api_cannot_honour_are_refused(fake_tensorrt_llm, tiny_pair, device: str) -> None:
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES"):
        create_engine("m", _spec(tiny_pair["small"], device=device))
    assert FakeLLM.instances == []


def test_without_tensorrt_llm_the_error_names_the_image(tiny_pair, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)
    with pytest.raises(TensorRTLLMUnavailable, match="trtllm-python-py3"):
        create_engine("m", _spec(tiny_pair["small"]))


# --- spans on the stand-in ---------------------------------------------------------------------------
PROMPTS = {"a": [5, 9, 33, 71, 2, 18, 44, 90, 7, 12, 61, 3], "b": [11, 4, 95, 37, 60, 2, 19, 73, 28]}
FOREIGN = [17, 29, 31]  # tokens "the other model" wrote while b was pending


def _run_script(engine) -> tuple[dict[str, list[int]], list[str]]:
    """prefill a, b; decode both; b pending for 2 steps; b extends; a released; c re-added."""
    out: dict[str, list[int]] = {k: [] for k in ("a", "b", "c")}
    trace = []

    def step(feeds: dict[str, list[int] | None]) -> None:
        rows = [StepRow(k, [out[k][-1]] if v is None else v) for k, v in feeds.items()]
        result = engine.step(rows)
        for seq_id, token in zip(result.seq_ids, result.sampled.tolist()):
            out[seq_id].append(token)
        trace.append(",".join(feeds))

    for seq_id in PROMPTS:
        engine.add_sequence(seq_id)
    step({"a": PROMPTS["a"], "b": PROMPTS["b"]})
    step({"a": None, "b": None})
    step({"a": None})
    step({"a": None})
    step({"a": None, "b": [out["b"][-1]] + FOREIGN})
    step({"a": None, "b": None})
    engine.release("a")
    engine.add_sequence("c")
    step({"c": PROMPTS["a"][:8], "b": None})
    return out, trace


@pytest.fixture
def engine(fake_tensorrt_llm, tiny_pair) -> TensorRTLLMEngine:
    return create_engine("small", _spec(tiny_pair["small"]))


def test_greedy_tokens_equal_the_torch_engines(engine, tiny_pair, make_engine) -> None:
    tokens, _ = _run_script(engine)
    expected, _ = _run_script(make_engine(tiny_pair["small"], block_size=4))
    assert tokens == expected


def test_a_request_per_span_with_the_whole_context_on_resume(engine) -> None:
    _run_script(engine)
    requests = FakeLLM.instances[0].requests
    # a: one span for prefill + 5 decodes; b: prefill span, then one resume span; c: one span
    assert len(requests) == 4
    a, b1, b2, c = requests
    assert a.prompt_token_ids == PROMPTS["a"] and len(a.outputs[0].token_ids) == 6
    assert b1.prompt_token_ids == PROMPTS["b"] and b1.aborted  # ended when b went pending
    # the resume carries the whole context: prompt, both delivered tokens, the foreign tokens
    assert b2.prompt_token_ids[:len(PROMPTS["b"])] == PROMPTS["b"]
    assert b2.prompt_token_ids[len(PROMPTS["b"]):] == b1.outputs[0].token_ids[:2] + FOREIGN
    assert a.aborted and c.prompt_token_ids == PROMPTS["a"][:8]  # release ended a's span
    for request in requests:
        assert request.sampling_params.top_k == 1 and request.sampling_params.ignore_eos
        assert request.sampling_params.max_tokens == SPAN_TOKENS


def test_every_span_keeps_its_blocks_above_the_default_priority_for_a_while(engine) -> None:
    """Pending/resume by resubmission: while a sequence is away its blocks wait in the reuse cache,
    and every block of every span (its whole context and what it generates) outranks other cached
    prefixes there, for a bounded time."""
    _run_script(engine)
    requests = FakeLLM.instances[0].requests
    assert len(requests) == 4
    for request in requests:
        retention = request.kv_cache_retention_config
        assert isinstance(retention, FakeKvCacheRetentionConfig)
        (whole,) = retention.token_range_retention_configs
        assert (whole.token_start, whole.token_end) == (0, None)  # the whole context given
        for priority, lapse in ((whole.priority, whole.duration_ms),
                                (retention.decode_retention_priority, retention.decode_duration_ms)):
            assert DEFAULT_RETENTION_PRIORITY < priority <= 100
            assert lapse == timedelta(seconds=RETENTION_S) and lapse > timedelta(0)


def test_a_sequence_left_out_of_a_step_stops_generating_at_once(engine) -> None:
    for seq_id in PROMPTS:
        engine.add_sequence(seq_id)
    engine.step([StepRow(k, v) for k, v in PROMPTS.items()])
    a_span, b_span = FakeLLM.instances[0].requests
    engine.step([StepRow("a", [a_span.outputs[0].token_ids[-1]])])
    assert b_span.aborted and not a_span.aborted
    assert set(engine.span_requests()) == {"a"} and engine.num_cached("b") == len(PROMPTS["b"])


def test_a_span_that_ends_restarts_over_the_whole_context(engine, monkeypatch) -> None:
    monkeypatch.setattr("tokenrouter.engine.tensorrt_llm.SPAN_TOKENS", 2)
    engine.add_sequence("a")
    tokens = [int(engine.step([StepRow("a", PROMPTS["a"])]).sampled[0])]
    for _ in range(4):
        tokens.append(int(engine.step([StepRow("a", [tokens[-1]])]).sampled[0]))
    requests = FakeLLM.instances[0].requests
    assert [len(r.prompt_token_ids) for r in requests] == [12, 14, 16]
    assert requests[2].prompt_token_ids == PROMPTS["a"] + tokens[:4]


def test_routing_signal_is_the_top_logprobs(engine) -> None:
    engine.add_sequence("a")
    result = engine.step([StepRow("a", PROMPTS["a"])], top_logits=3)
    row = result.logits[0]
    finite = torch.isfinite(row)
    assert int(finite.sum()) == LOGPROBS and torch.exp(row[finite]).sum() <= 1.0 + 1e-5
    assert int(row.argmax()) == int(result.sampled[0]) == int(result.topk_indices[0, 0])
    assert result.positions.tolist() == [len(PROMPTS["a"])]


def test_hidden_states_are_refused_with_the_policies_that_need_them(engine) -> None:
    engine.add_sequence("a")
    with pytest.raises(HiddenStatesUnavailable, match="citer"):
        engine.step([StepRow("a", [1])], return_hidden=True)
    assert engine.num_cached("a") == 0
    needs_hidden = {name for name, cls in registered_policies().items() if getattr(cls, "needs_hidden", False)}
    assert {p.split(" ")[0] for p in HIDDEN_STATE_POLICIES} >= needs_hidden


def test_exhaustion_and_a_failed_request_change_nothing(engine, monkeypatch) -> None:
    engine.add_sequence("a")
    engine.step([StepRow("a", PROMPTS["a"])])
    free = engine.num_free_blocks
    engine.add_sequence("big")
    with pytest.raises(KVCacheExhausted):
        engine.step([StepRow("big", list(range(1, 2000)))])
    assert engine.num_free_blocks == free and engine.num_cached("big") == 0
    monkeypatch.setattr(FakeResult, "__next__", lambda self: (_ for _ in ()).throw(RuntimeError("executor died")))
    with pytest.raises(RuntimeError, match="executor died"):
        engine.step([StepRow("a", [3, 4])])
    assert engine.num_cached("a") == len(PROMPTS["a"]) and engine.num_free_blocks == free
    assert "a" not in engine.span_requests()


# --- on a GPU --------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TRTLLM, reason="needs tensorrt_llm (the NGC -trtllm-python-py3 image)")
def test_on_tensorrt_llm_greedy_tokens_equal_the_torch_engines() -> None:
    """Run in the trtllm image on a GPU: TOKENROUTER_TRTLLM_TEST_MODEL = an HF checkpoint (Qwen2.5-0.5B-Instruct)."""
    path = os.environ.get("TOKENROUTER_TRTLLM_TEST_MODEL")
    if not path:
        pytest.fail("set TOKENROUTER_TRTLLM_TEST_MODEL to an HF checkpoint directory")
    engine = create_engine("trt", _spec(Path(path), dtype="float16", kv_cache_tokens=8192, gpu_memory_utilization=0.3))
    try:
        tokens, _ = _run_script(engine)
    finally:
        engine.close()
    torch_engine = create_engine("torch", ModelSpec(path=path, device="cuda", dtype="float16", kv_cache_tokens=8192))
    expected, _ = _run_script(torch_engine)  # same dtype: greedy ties are rare but possible between kernels
    assert tokens == expected
