"""The TensorRT-LLM engine adapter (GPU, the NGC -trtllm-python-py3 image): the step contract on
TensorRT-LLM's LLM API (PyTorch backend, TensorRT-LLM >= 1.0). UNVERIFIED: no GPU has run it yet;
docs/engine.md says how to verify it.

TensorRT-LLM cannot pause a sequence and later append tokens to its KV, nor run one forward step
on request. So the adapter works in *spans*, the shape of the vLLM engine where TensorRT-LLM allows:

- A span is one streaming request (``LLM.generate_async(context, streaming=True)``) over a
  sequence's whole context. TensorRT-LLM schedules it with its in-flight batching and streams its
  tokens; each ``step`` hands the runtime the span's next token. A decode row (the span's own last
  token fed back, same sampling) continues the span; no new request.
- Anything else (a prefill, an extend with another model's tokens, other sampling) ends the span
  (``abort``) and starts a new one over the whole context. KV-cache block reuse finds the blocks the
  previous span stored, so only the tail beyond the last full reused block is computed: prefix
  reuse on resume. TensorRT-LLM has no per-request pause that keeps KV; this resubmission is the
  pending/resume it allows.
- A sequence left out of a step is pending: its span is aborted at once (its blocks go to the reuse
  cache), so a pending sequence costs no GPU time. A span also ends after ``SPAN_TOKENS`` tokens
  and restarts the same way, which bounds the tokens generated ahead of the router and thrown away
  at a handoff.
- While a sequence is away its blocks sit in the reuse cache, where TensorRT-LLM evicts by priority,
  then least recently used. Every span asks ``RETENTION_PRIORITY`` (above the default 35) for all of
  its blocks, prompt and generated, for ``RETENTION_S``: other requests' cached prefixes go first.
  The priority lapses afterwards (TensorRT-LLM cannot lower it on release), so blocks of finished
  sequences do not pin the cache for long. An evicted block is recomputed at the resume: slower,
  never wrong. (The PyTorch backend passes the retention config on since TensorRT-LLM PR #8634,
  October 2025; that 1.2.x applies it is unverified.)
- The routing signal comes from TensorRT-LLM's log-probabilities (``logprobs=LOGPROBS``):
  ``StepResult.logits`` holds each row's top-``LOGPROBS`` log-probabilities (the sampled token's
  always included) and -inf elsewhere. Argmax, top probabilities and margins are exact; an entropy
  is taken over those tokens only. Full-vocabulary logits would cross TensorRT-LLM's process
  boundary for every token, so they are not asked for.
- TensorRT-LLM samples (greedy: ``top_k=1``); greedy tokens equal the other engines', sampled
  tokens follow TensorRT-LLM's seeded sampler, not ``sample_tokens``. Hidden states are not exposed.
- The logit processing is TensorRT-LLM's own (``span_sampling_arguments``): its penalties count a
  span's whole context, which is the request's (prompt and every model's output), as on the other
  engines. ``min_tokens`` is a ban of the request's end ids through ``embedding_bias`` on a span cut
  to end where the request reaches ``min_tokens`` (TensorRT-LLM's own ``min_tokens`` knows one end
  id and counts from the span's start), so the next span runs without it.

Block accounting for admission is a ``BlockPool`` over ``kv_cache_tokens / block_size``, counted as
on the other engines; TensorRT-LLM's own pool is sized to match (``KvCacheConfig.max_tokens``).
Everything that touches TensorRT-LLM is imported lazily; importing this module never needs it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import torch

from .base import SamplingParams, SeqId, StepResult, StepRow, full_logits_needed
from .dtypes import resolve_dtype
from .loader import eos_token_ids_of, generation_config_of
from .pooled import PooledEngine
from .ranks import gpu_rank_devices

if TYPE_CHECKING:
    from ..config import ModelSpec

TARGET = "TensorRT-LLM >= 1.0, LLM API with the PyTorch backend (written against 1.2.1)"
INSTALL_HINT = (
    "engine 'tensorrt_llm' needs the tensorrt_llm package >= 1.0 (the NGC image "
    "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3 ships TensorRT-LLM 1.2.1); or use engine: vllm"
)
LOGPROBS = 20  # top log-probabilities per token: the routing signal
SPAN_TOKENS = 64  # tokens one request may generate ahead of the router before it restarts
# KV block retention while a sequence is away (TensorRT-LLM's priorities: 0 to 100, default 35).
RETENTION_PRIORITY = 90
RETENTION_S = 60.0  # longer than a peer's visit takes; afterwards the blocks fall back to the default
# The shipped policies whose router reads hidden states (needs_hidden); a test keeps this in step.
HIDDEN_STATE_POLICIES = ("citer", "co_llm", "r2r", "query_level (mode: classifier)")


class TensorRTLLMUnavailable(ImportError):
    """The tensorrt_llm package is not installed (any machine but the GPU image)."""


class HiddenStatesUnavailable(NotImplementedError):
    """A step asked for hidden states, which TensorRT-LLM does not expose."""


def import_tensorrt_llm() -> ModuleType:
    try:
        import tensorrt_llm
    except ImportError as err:
        raise TensorRTLLMUnavailable(INSTALL_HINT) from err
    return tensorrt_llm


def hidden_states_error(name: str) -> HiddenStatesUnavailable:
    return HiddenStatesUnavailable(
        f"model '{name}' runs on engine 'tensorrt_llm', which cannot return hidden states (TensorRT-LLM "
        f"does not expose them); the policies that need them ({', '.join(HIDDEN_STATE_POLICIES)}) must run "
        f"their models on engine: torch or vllm. Logit-based policies work on tensorrt_llm."
    )


# --- what the adapter asks of TensorRT-LLM (pure functions: the CPU tests check them) ---------------
def kv_cache_arguments(spec: ModelSpec) -> dict[str, Any]:
    """``tensorrt_llm.llmapi.KvCacheConfig`` keywords: reuse on, the spec's pool plus a block of headroom per row."""
    return {
        "enable_block_reuse": True,
        "max_tokens": spec.kv_cache_tokens + spec.max_batch_size * spec.block_size,
        # the smaller of the two applies: two models on one GPU each keep to their share
        "free_gpu_memory_fraction": spec.gpu_memory_utilization,
    }


def llm_arguments(spec: ModelSpec, kv_cache_config: Any) -> dict[str, Any]:
    """``tensorrt_llm.LLM`` keywords (PyTorch backend, the default from 1.0): token ids in and out."""
    return {
        "model": spec.path,
        "skip_tokenizer_init": True,
        "dtype": resolve_dtype(spec, on_gpu=True),
        "kv_cache_config": kv_cache_config,
        "max_batch_size": spec.max_batch_size,
        "max_num_tokens": spec.max_prefill_tokens + spec.max_batch_size,
        # its ranks are the first tensor_parallel_size visible GPUs (unverified here, like the rest)
        "tensor_parallel_size": spec.tensor_parallel_size,
    }


class RetentionConfigClass(Protocol):
    """``tensorrt_llm.llmapi.KvCacheRetentionConfig`` as retention_config uses it."""

    TokenRangeRetentionConfig: Callable[..., Any]

    def __call__(self, *, token_range_retention_configs: list[Any], decode_retention_priority: int,
                 decode_duration_ms: timedelta) -> Any: ...


def retention_config(retention_class: RetentionConfigClass) -> Any:
    """``tensorrt_llm.llmapi.KvCacheRetentionConfig`` for every span: all of its blocks (the context
    it was given, from token 0 to the end, and the tokens it generates) at ``RETENTION_PRIORITY``
    for ``RETENTION_S``."""
    lapse = timedelta(seconds=RETENTION_S)
    whole_context = retention_class.TokenRangeRetentionConfig(token_start=0, token_end=None,
                                                              priority=RETENTION_PRIORITY, duration_ms=lapse)
    return retention_class(token_range_retention_configs=[whole_context], decode_retention_priority=RETENTION_PRIORITY,
                           decode_duration_ms=lapse)


def span_sampling_arguments(sampling: SamplingParams, max_tokens: int, *, generated: int = 0,
                            vocab_size: int = 0) -> dict[str, Any]:
    """``tensorrt_llm.SamplingParams`` keywords for one span: never stops on its own, ids only,
    logprobs. ``generated``: output tokens the request has at the span's start."""
    arguments: dict[str, Any] = {"max_tokens": max_tokens, "ignore_eos": True, "detokenize": False,
                                 "logprobs": LOGPROBS, "seed": sampling.seed}
    if sampling.greedy:
        arguments["top_k"] = 1
    else:
        arguments.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or None)
    for name, off in (("repetition_penalty", 1.0), ("presence_penalty", 0.0), ("frequency_penalty", 0.0)):
        if getattr(sampling, name) != off:
            arguments[name] = getattr(sampling, name)
    bias = dict(sampling.logit_bias)
    if sampling.min_tokens > generated and sampling.end_ids:
        arguments["max_tokens"] = min(max_tokens, sampling.min_tokens - generated)  # the ban ends with the span
        bias.update({token: float("-inf") for token in sampling.end_ids})
    if bias:
        embedding_bias = torch.zeros(vocab_size, dtype=torch.float32)
        embedding_bias[list(bias)] = torch.tensor(list(bias.values()), dtype=torch.float32)
        arguments["embedding_bias"] = embedding_bias
    return arguments


def logprob_row(logprobs: dict[int, Any], vocab_size: int) -> torch.Tensor:
    """One token's ``{token id: Logprob}`` as a float32 [V] row of log-probabilities, -inf elsewhere."""
    row = torch.full((vocab_size,), float("-inf"), dtype=torch.float32)
    for token, entry in logprobs.items():
        row[token] = entry.logprob
    return row


# --- spans -----------------------------------------------------------------------------------------
class SpanEnded(RuntimeError):
    """The span's request finished (its max_tokens) before the step's token."""


@dataclass
class Span:
    """One streaming request: the tokens TensorRT-LLM generated ahead of the router, handed out one per step."""

    result: Any  # tensorrt_llm's RequestOutput (a GenerationResult), streaming
    sampling: SamplingParams
    ready: deque[tuple[int, dict[int, Any]]] = field(default_factory=deque)
    delivered: int | None = None  # the token the last step returned

    def continues(self, new_tokens: Sequence[int], sampling: SamplingParams) -> bool:
        """A decode of this span: the runtime fed back exactly the token we gave it, same sampling."""
        return self.delivered is not None and list(new_tokens) == [self.delivered] and sampling == self.sampling

    def next_token(self) -> tuple[int, dict[int, Any]]:
        while not self.ready:
            if self.result.finished:
                raise SpanEnded("the span's request finished")
            next(self.result)  # blocks until TensorRT-LLM streams the request's next response
            output = self.result.outputs[0]
            self.ready.extend(zip(output.token_ids_diff, output.logprobs_diff))
        token, logprobs = self.ready.popleft()
        self.delivered = token
        return token, logprobs

    def abort(self) -> None:
        if not self.result.finished:
            self.result.abort()


# --- the engine ------------------------------------------------------------------------------------
class TensorRTLLMEngine(PooledEngine):
    def __init__(self, name: str, llm: Any, sampling_params_class: type, *, num_blocks: int, block_size: int,
                 vocab_size: int, hidden_size: int, max_model_len: int, eos_token_ids: frozenset[int],
                 retention: Any = None) -> None:
        """``retention``: the KvCacheRetentionConfig every span is submitted with (``retention_config``)."""
        super().__init__(num_blocks, block_size)
        self.name = name
        self._llm = llm
        self._sampling_params_class = sampling_params_class
        self._retention = retention
        self._vocab_size, self._hidden_size, self._max_model_len = vocab_size, hidden_size, max_model_len
        self._eos = eos_token_ids
        self._contexts: dict[SeqId, list[int]] = {}
        self._spans: dict[SeqId, Span] = {}

    @classmethod
    def from_spec(cls, name: str, spec: ModelSpec) -> "TensorRTLLMEngine":
        if spec.path is None:
            raise ValueError(f"model '{name}': the tensorrt_llm engine needs a path (an HF model directory)")
        module = import_tensorrt_llm()
        from tensorrt_llm.llmapi import KvCacheConfig, KvCacheRetentionConfig
        from transformers import AutoConfig

        if spec.device not in ("cuda", "cuda:0", "auto"):
            # the LLM API places its worker on the first visible GPU; it takes no device index
            raise ValueError(f"model '{name}': engine 'tensorrt_llm' runs on the first visible GPU; set device: cuda "
                             f"and choose the GPU with CUDA_VISIBLE_DEVICES (got device: {spec.device})")
        if spec.tensor_parallel_size > 1:
            gpu_rank_devices(name, spec)  # enough visible GPUs, or RankPlacementError naming the field
        hf_config = AutoConfig.from_pretrained(spec.path, local_files_only=True)
        llm = module.LLM(**llm_arguments(spec, KvCacheConfig(**kv_cache_arguments(spec))))
        return cls(name, llm, module.SamplingParams, num_blocks=max(1, spec.kv_cache_tokens // spec.block_size),
                   block_size=spec.block_size, vocab_size=hf_config.vocab_size, hidden_size=hf_config.hidden_size,
                   # a request needs room for the token it samples
                   max_model_len=hf_config.max_position_embeddings - 1,
                   eos_token_ids=eos_token_ids_of(generation_config_of(spec.path), hf_config),
                   retention=retention_config(KvCacheRetentionConfig))

    # --- shape facts ----------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def hidden_size(self) -> int:
        return self._hidden_size

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    # --- sequences ------------------------------------------------------------------------------
    def add_sequence(self, seq_id: SeqId) -> None:
        super().add_sequence(seq_id)
        self._contexts[seq_id] = []

    def release(self, seq_id: SeqId) -> bool:
        self._end_span(seq_id)
        self._contexts.pop(seq_id, None)
        return super().release(seq_id)

    def span_requests(self) -> dict[SeqId, Any]:
        """The live request of each sequence that has one (for tests and diagnostics)."""
        return {seq_id: span.result for seq_id, span in self._spans.items()}

    # --- the step -------------------------------------------------------------------------------
    def step(self, rows: Sequence[StepRow], *, return_hidden: bool = False, top_logits: int = 0,
             return_logits: bool = True) -> StepResult:
        if return_hidden:
            raise hidden_states_error(self.name)
        tokens = self.check_rows(rows, top_logits)
        starts = [self._pool.length(row.seq_id) for row in rows]
        self._pool.append({row.seq_id: len(new) for row, new in zip(rows, tokens)})  # all or nothing
        stepping = {row.seq_id for row in rows}
        for seq_id in [s for s in self._spans if s not in stepping]:
            self._end_span(seq_id)  # pending from now on: stop generating ahead for it
        try:
            outputs = [self._advance(row.seq_id, new, row.sampling) for row, new in zip(rows, tokens)]
        except BaseException:
            # Undo the step: the contexts lose its tokens, the spans are ended (they may have run on).
            for row, start in zip(rows, starts):
                self._end_span(row.seq_id)
                del self._contexts[row.seq_id][start:]
                self._pool.truncate(row.seq_id, start)
            raise
        result = StepResult(
            seq_ids=[row.seq_id for row in rows],
            sampled=torch.tensor([token for token, _ in outputs], dtype=torch.int64),
            logits=torch.stack([logprob_row(logprobs, self._vocab_size) for _, logprobs in outputs]),
            positions=torch.tensor([start + len(new) for start, new in zip(starts, tokens)], dtype=torch.int64),
        )
        if top_logits:
            top = torch.topk(result.logits, top_logits, dim=-1)
            result.topk_values, result.topk_indices = top.values, top.indices
        if not full_logits_needed(rows, return_logits):
            result.logits = None
        return result

    def _advance(self, seq_id: SeqId, new: Sequence[int], sampling: SamplingParams) -> tuple[int, dict[int, Any]]:
        context = self._contexts[seq_id]
        context.extend(new)
        span = self._spans.get(seq_id)
        if span is None or not span.continues(new, sampling):
            span = self._start_span(seq_id, sampling)
        try:
            return span.next_token()
        except SpanEnded:
            return self._start_span(seq_id, sampling).next_token()

    def _start_span(self, seq_id: SeqId, sampling: SamplingParams) -> Span:
        """A new request over the whole context; block reuse computes only the uncached tail."""
        self._end_span(seq_id)
        context = self._contexts[seq_id]
        max_tokens = min(SPAN_TOKENS, self._max_model_len + 1 - len(context))
        params = self._sampling_params_class(**span_sampling_arguments(
            sampling, max_tokens, generated=len(context) - sampling.prompt_len, vocab_size=self._vocab_size))
        result = self._llm.generate_async(list(context), sampling_params=params, streaming=True,
                                          kv_cache_retention_config=self._retention)
        span = self._spans[seq_id] = Span(result, sampling)
        return span

    def _end_span(self, seq_id: SeqId) -> None:
        span = self._spans.pop(seq_id, None)
        if span is not None:
            span.abort()

    def close(self) -> None:
        self.release_all()
        shutdown = getattr(self._llm, "shutdown", None)
        if shutdown is not None:
            shutdown()
