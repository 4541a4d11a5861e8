"""The TensorRT-LLM engine adapter (GPU image): the step contract on TensorRT-LLM's executor.

TensorRT-LLM cannot pause a sequence and later append tokens to its cached KV, so the adapter
emulates it. It keeps every sequence's token context itself, and a step submits, for each row, one
request for exactly one new token over the row's whole context (prefill, extend and decode alike).
KV-cache block reuse finds the blocks the sequence's previous request left behind, so only the
uncached tail is computed; where the TensorRT-LLM version has retention priorities, a live
sequence's blocks outrank other reusable blocks, so a pending sequence's KV survives eviction.
Eviction never changes results, it only costs recompute.

TensorRT-LLM decodes greedily here; the adapter asks for the token's generation logits and samples
with ``sample_tokens`` itself, so tokens are reproducible per (seed, position) exactly as on the
other engines. TensorRT-LLM does not expose hidden states.

Targets TensorRT-LLM 0.14.0 (the version in nvcr.io/nvidia/tritonserver:24.10-trtllm-python-py3):
the executor bindings ``tensorrt_llm.bindings.executor`` to run, ``tensorrt_llm.build`` to turn an
HF checkpoint into an engine. ``KvCacheRetentionConfig`` (newer releases) is used when present.
Everything that touches TensorRT-LLM is imported lazily; importing this module never needs it.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, Sequence

import torch

from ..config import ModelSpec
from .base import Engine, SeqId, StepResult, StepRow, UnknownSequence
from .kv_pool import BlockPool
from .pooled import check_rows, sampled_result

TARGET_VERSION = "0.14.0"
INSTALL_HINT = (
    "engine 'tensorrt_llm' needs the tensorrt_llm package (the NGC -trtllm-python-py3 image, e.g. "
    "nvcr.io/nvidia/tritonserver:24.10-trtllm-python-py3 with TensorRT-LLM 0.14.0); install it on a CUDA "
    "machine with `pip install tensorrt_llm==0.14.0 --extra-index-url https://pypi.nvidia.com`, or use "
    "engine: torch"
)
# The shipped policies whose router reads hidden states (needs_hidden); a test keeps this in step.
HIDDEN_STATE_POLICIES = ("citer", "co_llm", "r2r", "query_level (mode: classifier)")
CACHE_ENV = "TOKENROUTER_TRTLLM_CACHE"
ENGINE_MARKER = "TOKENROUTER_ENGINE_COMPLETE"


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
        f"their models on engine: torch. Logit-based policies work on tensorrt_llm."
    )


# --- the engine directory ------------------------------------------------------------------------
@dataclass(frozen=True)
class EngineLayout:
    """What the adapter reads from a TensorRT-LLM engine directory's config.json."""

    architecture: str
    dtype: str
    vocab_size: int
    hidden_size: int
    max_input_len: int
    max_seq_len: int
    tokens_per_block: int
    gather_generation_logits: bool
    paged_context_fmha: bool

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "EngineLayout":
        pretrained, build = config["pretrained_config"], config["build_config"]
        plugins = build.get("plugin_config", {})
        return cls(
            architecture=pretrained["architecture"],
            dtype=pretrained["dtype"],
            vocab_size=int(pretrained["vocab_size"]),
            hidden_size=int(pretrained["hidden_size"]),
            max_input_len=int(build["max_input_len"]),
            max_seq_len=int(build["max_seq_len"]),
            tokens_per_block=int(plugins.get("tokens_per_block", 64)),  # 64: the 0.14 default
            gather_generation_logits=bool(build.get("gather_generation_logits", False)),
            paged_context_fmha=bool(plugins.get("use_paged_context_fmha", False)),
        )

    @classmethod
    def read(cls, engine_dir: Path) -> "EngineLayout":
        return cls.from_config(json.loads((Path(engine_dir) / "config.json").read_text()))

    @property
    def max_model_len(self) -> int:
        # A request holds the whole context as input and asks for one more token.
        return min(self.max_input_len, self.max_seq_len - 1)

    def check(self, name: str, spec: ModelSpec) -> None:
        """Every way the engine cannot serve this spec, in one error."""
        problems = []
        if self.tokens_per_block != spec.block_size:
            problems.append(f"its KV blocks hold {self.tokens_per_block} tokens but block_size is "
                            f"{spec.block_size} (set block_size: {self.tokens_per_block})")
        if not self.gather_generation_logits:
            problems.append("it was built without gather_generation_logits (the adapter samples from logits)")
        if not self.paged_context_fmha:
            problems.append("it was built without use_paged_context_fmha (KV block reuse needs it)")
        if self.dtype != spec.dtype:
            problems.append(f"its dtype is {self.dtype} but the spec says {spec.dtype}")
        if problems:
            raise ValueError(f"model '{name}': the TensorRT-LLM engine cannot be used: " + "; ".join(problems))


def is_engine_dir(path: Path) -> bool:
    """True for a TensorRT-LLM engine directory (config.json with a build_config), False for an HF checkpoint."""
    config = Path(path) / "config.json"
    if not config.is_file():
        raise ValueError(f"engine 'tensorrt_llm' needs a TensorRT-LLM engine directory or an HF checkpoint "
                         f"directory (with config.json), got {path}")
    return "build_config" in json.loads(config.read_text())


def read_eos_ids(model_dir: Path) -> frozenset[int]:
    """EOS ids from generation_config.json (an engine's config.json has none)."""
    source = Path(model_dir) / "generation_config.json"
    if not source.is_file():
        raise ValueError(f"{model_dir} has no generation_config.json; copy the checkpoint's into the engine "
                         f"directory so the runtime knows the EOS tokens")
    value = json.loads(source.read_text()).get("eos_token_id")
    ids = [value] if isinstance(value, int) else list(value or [])
    if not ids:
        raise ValueError(f"{source} names no eos_token_id")
    return frozenset(int(v) for v in ids)


def build_settings(hf_config: dict[str, Any], spec: ModelSpec) -> dict[str, int]:
    """BuildConfig limits for an engine built from an HF checkpoint for this spec."""
    max_seq_len = int(hf_config["max_position_embeddings"])
    # 0.14 reuses only full blocks, so every row of a step may recompute up to a block of tokens;
    # chunked context wants the token budget in whole blocks.
    blocks = -(-(spec.max_prefill_tokens + spec.max_batch_size * spec.block_size) // spec.block_size)
    return {
        "max_batch_size": spec.max_batch_size,
        "max_seq_len": max_seq_len,
        "max_input_len": max_seq_len - 1,
        "max_num_tokens": blocks * spec.block_size,
    }


def engine_cache_dir(hf_dir: Path, spec: ModelSpec, version: str, root: Path | None = None) -> Path:
    """Where the engine built from ``hf_dir`` for this spec lives; the name changes with any build input."""
    hf_dir = Path(hf_dir).resolve()
    weights = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in hf_dir.glob("*.safetensors"))
    key = json.dumps({
        "checkpoint": str(hf_dir),
        "config": hashlib.sha256((hf_dir / "config.json").read_bytes()).hexdigest(),
        "weights": weights,
        "dtype": spec.dtype,
        "block_size": spec.block_size,
        "build": build_settings(json.loads((hf_dir / "config.json").read_text()), spec),
        "tensorrt_llm": version,
    }, sort_keys=True)
    root = Path(root or os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "tokenrouter" / "trtllm")
    return root / f"{hf_dir.name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def build_engine(trtllm: ModuleType, hf_dir: Path, out_dir: Path, spec: ModelSpec) -> None:
    """Build an engine the adapter can use from an HF checkpoint; rename into place when complete."""
    from tensorrt_llm.models import MODEL_MAP

    hf_config = json.loads((Path(hf_dir) / "config.json").read_text())
    architecture = hf_config["architectures"][0]
    if architecture not in MODEL_MAP:
        raise ValueError(f"TensorRT-LLM {trtllm.__version__} cannot build {architecture} ({hf_dir})")
    if spec.dtype == "float32":
        raise ValueError("engine 'tensorrt_llm' needs dtype float16 or bfloat16: KV block reuse needs paged "
                         "context FMHA, which has no float32 kernels")
    model = MODEL_MAP[architecture].from_hugging_face(str(hf_dir), dtype=spec.dtype)
    config = trtllm.BuildConfig(**build_settings(hf_config, spec), gather_generation_logits=True)
    config.plugin_config.use_paged_context_fmha = True
    config.plugin_config.tokens_per_block = spec.block_size
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        trtllm.build(model, config).save(str(tmp))
        shutil.copy(Path(hf_dir) / "generation_config.json", tmp / "generation_config.json")
        (tmp / ENGINE_MARKER).write_text(trtllm.__version__)
        os.rename(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def resolve_engine_dir(trtllm: ModuleType, spec: ModelSpec) -> Path:
    """``spec.path`` itself when it is an engine directory; else the engine built (once) from the HF checkpoint."""
    path = Path(spec.path)
    if is_engine_dir(path):
        return path
    out_dir = engine_cache_dir(path, spec, trtllm.__version__)
    if not (out_dir / ENGINE_MARKER).is_file():
        shutil.rmtree(out_dir, ignore_errors=True)  # a crashed build left a partial directory
        build_engine(trtllm, path, out_dir, spec)
    return out_dir


# --- sequences, step plans and results (plain data: no TensorRT-LLM) -----------------------------
@dataclass(frozen=True)
class NextTokenRequest:
    """One row of a step as TensorRT-LLM sees it: the whole context, then exactly one new token."""

    seq_id: SeqId
    tokens: tuple[int, ...]
    start: int  # context length before this step's tokens

    @property
    def position(self) -> int:
        """Context position of the token this request produces (= the new cached length)."""
        return len(self.tokens)


@dataclass(frozen=True)
class Retention:
    """The KV retention every request asks for.

    A live sequence's blocks get ``priority`` (100 is TensorRT-LLM's maximum; the default is 35)
    for ``lease_s`` after its last request, renewed by every step it takes part in. A released or
    abandoned sequence's blocks fall back to the default when the lease runs out: the executor has
    no call that re-prioritizes or frees blocks stored for reuse.
    """

    priority: int = 100
    lease_s: float = 30.0


class ContextBook:
    """Each sequence's full token context, and the admission view of the pool (``BlockPool``).

    The real pool is TensorRT-LLM's. The book counts blocks exactly as the other engines do, so the
    runtime's admission control works unchanged.
    """

    def __init__(self, num_blocks: int, block_size: int, vocab_size: int, max_model_len: int) -> None:
        self.pool = BlockPool(num_blocks, block_size)
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self._contexts: dict[SeqId, tuple[int, ...]] = {}

    def add(self, seq_id: SeqId) -> None:
        self.pool.add(seq_id)
        self._contexts[seq_id] = ()

    def __contains__(self, seq_id: SeqId) -> bool:
        return seq_id in self._contexts

    def context(self, seq_id: SeqId) -> tuple[int, ...]:
        if seq_id not in self._contexts:
            raise UnknownSequence(seq_id)
        return self._contexts[seq_id]

    def sequence_ids(self) -> list[SeqId]:
        return list(self._contexts)

    def release(self, seq_id: SeqId) -> bool:
        self._contexts.pop(seq_id, None)
        return self.pool.free(seq_id)

    def begin(self, rows: Sequence[StepRow], top_logits: int) -> list[NextTokenRequest]:
        """Validate the step and reserve its blocks; raises with nothing changed."""
        requests = self._plan(rows, top_logits)
        self.pool.append({r.seq_id: r.position - r.start for r in requests})  # all or nothing
        return requests

    def commit(self, requests: Sequence[NextTokenRequest]) -> None:
        for request in requests:
            self._contexts[request.seq_id] = request.tokens

    def abort(self, requests: Sequence[NextTokenRequest]) -> None:
        """Undo ``begin`` after TensorRT-LLM failed: the contexts were never changed."""
        for request in requests:
            self.pool.truncate(request.seq_id, request.start)

    def _plan(self, rows: Sequence[StepRow], top_logits: int) -> list[NextTokenRequest]:
        new_tokens = check_rows(rows, top_logits=top_logits, vocab_size=self.vocab_size,
                                max_model_len=self.max_model_len, cached_length=lambda s: len(self.context(s)))
        return [NextTokenRequest(row.seq_id, self.context(row.seq_id) + new, len(self.context(row.seq_id)))
                for row, new in zip(rows, new_tokens)]


def step_result(rows: Sequence[StepRow], requests: Sequence[NextTokenRequest], logits: torch.Tensor,
                top_logits: int) -> StepResult:
    """Sample every row from its next-token logits [B, V], as every engine does."""
    return sampled_result(rows, logits, [request.position for request in requests], top_logits)


def first_token_logits(raw: Any, vocab_size: int) -> torch.Tensor:
    """Float32 logits [V] of the one generated token from TensorRT-LLM's generation logits.

    Non-streaming results are [beam_width, output_len, vocab(+padding)]; we ask for one beam and one token.
    """
    logits = torch.as_tensor(raw).float().cpu()
    if logits.shape[-1] < vocab_size:
        raise RuntimeError(f"TensorRT-LLM returned logits over {logits.shape[-1]} tokens, expected {vocab_size}")
    return logits.reshape(-1, logits.shape[-1])[0, :vocab_size]


class LogitsSource(Protocol):
    """Where a step's next-token logits come from: ``ExecutorRunner`` (TensorRT-LLM) in production."""

    def next_token_logits(self, requests: Sequence[NextTokenRequest]) -> torch.Tensor:
        """Float32 [B, V]: row i is the logits after the whole of ``requests[i].tokens``."""

    def close(self) -> None: ...


# --- TensorRT-LLM's executor (GPU only) ----------------------------------------------------------
class ExecutorRunner:
    """Runs next-token requests on a ``tensorrt_llm.bindings.executor.Executor`` and waits for all."""

    def __init__(self, executor: Any, bindings: ModuleType, vocab_size: int, retention: Retention,
                 timeout_s: float = 600.0) -> None:
        self._executor = executor
        self._bindings = bindings
        self._vocab_size = vocab_size
        self._timeout_s = timeout_s
        self._retention = self._retention_config(retention)
        # Greedy, one beam: TensorRT-LLM's own token is not used, only its logits.
        self._sampling = bindings.SamplingConfig(beam_width=1, top_k=1)
        self._output = bindings.OutputConfig(return_generation_logits=True, exclude_input_from_output=True)

    @classmethod
    def start(cls, engine_dir: Path, spec: ModelSpec, layout: EngineLayout, retention: Retention) -> "ExecutorRunner":
        from tensorrt_llm.bindings import executor as bindings

        # Headroom of one block per row: a request reserves a slot for its output token too.
        kv_cache = bindings.KvCacheConfig(enable_block_reuse=True,
                                          max_tokens=spec.kv_cache_tokens + spec.max_batch_size * spec.block_size)
        placement = {}
        if spec.device.startswith("cuda:"):
            placement["parallel_config"] = bindings.ParallelConfig(device_ids=[int(spec.device[5:])])
        config = bindings.ExecutorConfig(max_beam_width=1, kv_cache_config=kv_cache, enable_chunked_context=True,
                                         **placement)
        executor = bindings.Executor(str(engine_dir), bindings.ModelType.DECODER_ONLY, config)
        return cls(executor, bindings, layout.vocab_size, retention)

    def _retention_config(self, retention: Retention) -> Any:
        """TensorRT-LLM's retention config, or None where the version has none (0.14 has none)."""
        config_type = getattr(self._bindings, "KvCacheRetentionConfig", None)
        if config_type is None:
            return None
        lease = datetime.timedelta(seconds=retention.lease_s)
        whole_context = config_type.TokenRangeRetentionConfig(token_start=0, token_end=None,
                                                              priority=retention.priority, duration_ms=lease)
        return config_type(token_range_retention_configs=[whole_context], decode_retention_priority=retention.priority,
                           decode_duration_ms=lease)

    def _request(self, request: NextTokenRequest) -> Any:
        extra = {} if self._retention is None else {"kv_cache_retention_config": self._retention}
        # Positional max tokens: the keyword is max_new_tokens in 0.14 and max_tokens later.
        return self._bindings.Request(list(request.tokens), 1, streaming=False, sampling_config=self._sampling,
                                      output_config=self._output, **extra)

    def next_token_logits(self, requests: Sequence[NextTokenRequest]) -> torch.Tensor:
        """Float32 next-token logits [B, V], one row per request, after every request has finished."""
        ids = self._executor.enqueue_requests([self._request(r) for r in requests])
        responses = [self._final_response(request_id) for request_id in ids]  # drain all before raising
        errors = [f"{r.seq_id!r}: {resp.error_msg}" for r, resp in zip(requests, responses) if resp.has_error()]
        if errors:
            raise RuntimeError("TensorRT-LLM failed a step: " + "; ".join(errors))
        return torch.stack([first_token_logits(resp.result.generation_logits, self._vocab_size)
                            for resp in responses])

    def _final_response(self, request_id: int) -> Any:
        deadline = time.monotonic() + self._timeout_s
        while time.monotonic() < deadline:
            for response in self._executor.await_responses(request_id, timeout=datetime.timedelta(seconds=1)):
                if response.has_error() or response.result.is_final:
                    return response
        self._executor.cancel_request(request_id)
        raise TimeoutError(f"TensorRT-LLM request {request_id} did not finish in {self._timeout_s:.0f} s")

    def iteration_stats(self) -> list[Any]:
        """The executor's per-iteration stats since the last call (KV block reuse shows in kv_cache_stats)."""
        return list(self._executor.get_latest_iteration_stats())

    def close(self) -> None:
        self._executor.shutdown()


# --- the engine ----------------------------------------------------------------------------------
class TensorRTLLMEngine(Engine):
    def __init__(self, name: str, source: LogitsSource, layout: EngineLayout, eos_token_ids: frozenset[int], *,
                 num_blocks: int, block_size: int) -> None:
        self.name = name
        self.layout = layout
        self.source = source
        self._eos = eos_token_ids
        self._book = ContextBook(num_blocks, block_size, layout.vocab_size, layout.max_model_len)

    @classmethod
    def from_spec(cls, name: str, spec: ModelSpec) -> "TensorRTLLMEngine":
        trtllm = import_tensorrt_llm()
        if spec.device == "cpu":
            raise ValueError(f"model '{name}': TensorRT-LLM runs on CUDA only; set device: cuda (or cuda:N)")
        engine_dir = resolve_engine_dir(trtllm, spec)
        layout = EngineLayout.read(engine_dir)
        layout.check(name, spec)
        eos = read_eos_ids(engine_dir)
        runner = ExecutorRunner.start(engine_dir, spec, layout, Retention())
        return cls(name, runner, layout, eos, num_blocks=max(1, spec.kv_cache_tokens // spec.block_size),
                   block_size=spec.block_size)

    # --- shape facts ------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.layout.vocab_size

    @property
    def hidden_size(self) -> int:
        return self.layout.hidden_size

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos

    @property
    def max_model_len(self) -> int:
        return self.layout.max_model_len

    # --- KV pool (the admission view) -------------------------------------------------------------
    @property
    def block_size(self) -> int:
        return self._book.pool.block_size

    @property
    def num_total_blocks(self) -> int:
        return self._book.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self._book.pool.num_free

    # --- sequences --------------------------------------------------------------------------------
    def add_sequence(self, seq_id: SeqId) -> None:
        self._book.add(seq_id)

    def has_sequence(self, seq_id: SeqId) -> bool:
        return seq_id in self._book

    def num_cached(self, seq_id: SeqId) -> int:
        return len(self._book.context(seq_id))

    def sequence_ids(self) -> list[SeqId]:
        return self._book.sequence_ids()

    def release(self, seq_id: SeqId) -> bool:
        # TensorRT-LLM's copy of the blocks falls back to default priority when its lease ends.
        return self._book.release(seq_id)

    def step(self, rows: Sequence[StepRow], *, return_hidden: bool = False, top_logits: int = 0) -> StepResult:
        if return_hidden:
            raise hidden_states_error(self.name)
        requests = self._book.begin(rows, top_logits)
        try:
            logits = self.source.next_token_logits(requests)
        except BaseException:
            self._book.abort(requests)
            raise
        self._book.commit(requests)
        return step_result(rows, requests, logits, top_logits)

    def close(self) -> None:
        for seq_id in self._book.sequence_ids():
            self._book.release(seq_id)
        self.source.close()
