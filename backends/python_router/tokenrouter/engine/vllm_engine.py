"""vLLM as a step engine: each sequence is a resumable (streaming-input) vLLM request.

The subserver decides which rows run in a step; vLLM only ever sees those rows. Every row of a
step is added to vLLM's scheduler as the next input chunk of its request, with ``max_tokens=1``:
vLLM computes the chunk (prefill, decode and extend alike), samples one token and parks the
request in ``WAITING_FOR_STREAMING_REQ``, a state its scheduler never runs, with its KV blocks
kept. A parked request is exactly TokenRouter's *pending*: resuming it costs only the new
chunk's tokens. vLLM drops the token it sampled (it has no KV yet), so the next chunk carries the
token that was actually committed: ours, or the one another model produced.

Sampling is ours, not vLLM's: the model's ``compute_logits`` is wrapped to capture each sampled
row's final hidden state and full-vocabulary logits, and the shared reproducible sampler turns
them into tokens. The wrap and the fetch go through vLLM's worker extension and ``collective_rpc``
(``vllm_capture``), so they work the same with one rank in this process and with
``tensor_parallel_size`` ranks in vLLM's worker processes (the engine core, its scheduler and the
KV accounting stay in this process either way). So greedy and seeded sampling give the same
tokens as the PyTorch engine, at any tensor-parallel size, every policy gets the signals it asks
for (logits, top-k, hidden states), and vLLM's own sampler only runs a cheap greedy argmax that
is ignored.

vLLM's in-process engine core is an internal API: this module is the only place that touches it
(0.32 pinned in requirements.txt; 0.27.1, the 26.08 Triton image's, passes the same engine tests:
tools/vllm_versions.sh). What it needs is checked by capability before and after start, in
``vllm_compat``. It must be the only vLLM engine in its process: vLLM keeps a process-global
forward context and thread binding (``factory.create_engine`` runs it in a process of its own
unless the caller owns a whole process, as a Triton stub does).
"""

from __future__ import annotations

import inspect
import math
import os
import threading
import time
import weakref
from typing import Any, Sequence

import torch

from ..config import ModelSpec
from .base import (Engine, EngineLost, KVCacheExhausted, LengthTable, SeqId, StepResult, StepRow,
                   full_logits_needed)
from .dtypes import resolve_dtype
from .loader import eos_token_ids_of, generation_config_of
from .logit_processing import ContextCounts
from .pooled import check_rows, sampled_result
from .rank_watch import kill_all_when_one_dies
from .ranks import RankPlacementError, cpu_rank_cores, gpu_index, gpu_rank_devices, omp_threads_bind
from .vllm_capture import WORKER_EXTENSION
from .vllm_compat import UnsupportedVLLM, check_started_engine, require_vllm_capabilities, vllm_environment

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
MAX_SAMPLER_LOGPROBS = 20  # what record_sampler_logprobs may ask vLLM's sampler for (free until asked)


class VLLMEngine(LengthTable, Engine):
    """One model on vLLM's engine core, stepped synchronously in this process."""

    def __init__(self, name: str, llm_engine: Any, *, eos_token_ids: frozenset[int]) -> None:
        self.name = name
        self._llm = llm_engine
        self._core = llm_engine.engine_core.engine_core  # EngineCore, in-process; its executor runs the ranks
        self._scheduler = self._core.scheduler
        self._executor = self._core.model_executor
        # One rank's reply: the multiprocess executor asks only rank 0 to answer; the uniprocess
        # executor has only rank 0, and runs the call in this process (nothing is copied).
        self._one_reply = ({"unique_reply_rank": 0} if "unique_reply_rank" in
                           inspect.signature(self._executor.collective_rpc).parameters else {})
        self._across_processes = bool(self._one_reply)
        self._tensor_parallel_size = llm_engine.vllm_config.parallel_config.tensor_parallel_size
        self._model_config = llm_engine.model_config
        self._eos = eos_token_ids
        self._lengths: dict[SeqId, int] = {}  # tokens of each sequence whose KV vLLM holds
        self._context_counts = ContextCounts()  # for penalties (see logit_processing.py)
        self._request_ids: dict[SeqId, str] = {}
        self._next_id = 0
        self._chunk_params: Any = None  # vLLM's processed SamplingParams of a one-token chunk
        self._scheduled: dict[str, int] = {}
        self.last_step_tokens: dict[SeqId, int] = {}  # tokens vLLM computed per row in the last step
        self.last_fetch_s = 0.0  # what fetching the last step's rows from rank 0 took (benchmarks read it)
        self.last_fetch_bytes = 0  # the tensor bytes rank 0 sent back for them
        self._sampler_logprobs = 0
        # Per row of the last step, when recording: vLLM's sampled token and its sampler's top
        # log-probabilities {token: logprob} (the device check compares them with the captured logits).
        self.last_sampler_logprobs: dict[SeqId, tuple[int, dict[int, float]]] = {}
        try:
            self._runner_facts = self._rank0("tokenrouter_runner_facts")
            check_started_engine(llm_engine.vllm_config, self._runner_facts)
        except UnsupportedVLLM:
            self._core.shutdown()
            raise
        self._executor.collective_rpc("tokenrouter_install_capture")  # every rank wraps; rank 0 keeps
        if self._across_processes:
            self._watch_ranks()
        self._wrap_schedule()
        # Intra-op threads are per OS thread, and vLLM's CPU attention checks that the stepping
        # thread uses the count its metadata was planned with (the count set up at start here).
        self._threads = torch.get_num_threads()
        self._thread_state = threading.local()

    @classmethod
    def from_spec(cls, name: str, spec: ModelSpec) -> "VLLMEngine":
        if spec.path is None:
            raise ValueError(f"model '{name}': the vllm engine needs a path (an HF model directory)")
        os.environ.update(vllm_environment())  # before vLLM is imported
        if spec.threads:
            os.environ["OMP_NUM_THREADS"] = str(spec.threads)  # vLLM keeps torch at 1 thread otherwise
            torch.set_num_threads(spec.threads)
        require_vllm_capabilities()
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        hf_config = _hf_config(spec.path)
        on_cpu = spec.device.startswith("cpu") or (spec.device == "auto" and not torch.cuda.is_available())
        dtype = resolve_dtype(spec, on_gpu=not on_cpu)
        placement = rank_environment(name, spec, on_cpu=on_cpu)
        if "CUDA_VISIBLE_DEVICES" in placement and torch.cuda.is_initialized():
            # CUDA reads the variable once, when it starts: the model would land on another GPU.
            raise RankPlacementError(f"model '{name}': device {spec.device} cannot be honoured: CUDA already "
                                     "started in this process (choose the GPU with CUDA_VISIBLE_DEVICES instead)")
        os.environ.update(placement)
        if on_cpu:
            # vLLM's CPU backend sizes its KV pool from this variable (GiB); the exact block count
            # is set below, this only has to be large enough to hold it.
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.ceil(
                kv_bytes_per_token(hf_config, dtype) * (spec.kv_cache_tokens + spec.block_size) / 2**30)))
        args = EngineArgs(**engine_arguments(spec, dtype=dtype, on_cpu=on_cpu,
                                             max_position_embeddings=hf_config.max_position_embeddings))
        llm_engine = LLMEngine.from_engine_args(args)
        return cls(name, llm_engine, eos_token_ids=eos_token_ids_of(generation_config_of(spec.path), hf_config))

    # --- shape facts ----------------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        """What the weights and the KV compute in (``dtype: auto`` resolved, see dtypes.py)."""
        return self._model_config.dtype

    @property
    def vocab_size(self) -> int:
        return self._model_config.get_vocab_size()

    @property
    def hidden_size(self) -> int:
        return self._model_config.get_hidden_size()

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos

    @property
    def max_model_len(self) -> int:
        return self._model_config.max_model_len

    # --- KV pool (vLLM's) -------------------------------------------------------------------------
    @property
    def block_size(self) -> int:
        return self._scheduler.block_size

    @property
    def num_total_blocks(self) -> int:
        return self._block_pool.num_gpu_blocks - 1  # less the null block

    @property
    def num_free_blocks(self) -> int:
        return self._block_pool.get_num_free_blocks()

    @property
    def _block_pool(self) -> Any:
        return self._scheduler.kv_cache_manager.block_pool

    # --- sequences ----------------------------------------------------------------------------
    def add_sequence(self, seq_id: SeqId) -> None:
        if seq_id in self._lengths:
            raise ValueError(f"sequence {seq_id!r} is already held")
        self._lengths[seq_id] = 0
        # vLLM ids are ours, unique per engine lifetime: a released id never aliases a new sequence.
        self._request_ids[seq_id] = f"{self.name}-{self._next_id}"
        self._next_id += 1

    def release(self, seq_id: SeqId) -> bool:
        if seq_id not in self._lengths:
            return False
        del self._lengths[seq_id]
        self._context_counts.forget(seq_id)
        self._core.abort_requests([self._request_ids.pop(seq_id)])
        return True

    def computed_tokens(self, seq_id: SeqId) -> int:
        """Tokens vLLM itself says it has computed for the sequence (tests check resumes with it)."""
        request = self._scheduler.requests.get(self._request_ids[seq_id])
        return 0 if request is None else request.num_computed_tokens

    def block_ids(self, seq_id: SeqId) -> list[int]:
        """The KV block ids vLLM holds for the sequence, in context order (tests check reuse with it)."""
        return list(self._scheduler.kv_cache_manager.get_block_ids(self._request_ids[seq_id])[0])

    def runner_settings(self) -> dict[str, Any]:
        """What vLLM made of the settings vllm_compat sets (tests and the device check read it)."""
        import vllm.envs

        config = self._llm.vllm_config
        return {"VLLM_USE_V2_MODEL_RUNNER": vllm.envs.VLLM_USE_V2_MODEL_RUNNER,
                "async_scheduling": config.scheduler_config.async_scheduling,
                "input_batch": self._runner_facts["input_batch"],
                "tensor_parallel_size": config.parallel_config.tensor_parallel_size,
                "cudagraph_mode": str(getattr(config.compilation_config, "cudagraph_mode", None))}

    # --- the step -------------------------------------------------------------------------------
    def step(self, rows: Sequence[StepRow], *, return_hidden: bool = False, top_logits: int = 0,
             return_logits: bool = True) -> StepResult:
        self._check_ranks()
        tokens = check_rows(rows, top_logits=top_logits, vocab_size=self.vocab_size,
                            max_model_len=self.max_model_len, cached_length=self.num_cached)
        self._check_capacity(rows, tokens)
        self._match_threads()
        for row, new in zip(rows, tokens):
            self._add_chunk(self._request_ids[row.seq_id], list(new), first=self._lengths[row.seq_id] == 0)
        try:
            outputs, _ = self._core.step()
            self._check_scheduled(rows, tokens)
            if self._sampler_logprobs:
                self._record_sampler_logprobs(rows, outputs)
            full = full_logits_needed(rows, return_logits)
            # With the full rows our sampler and sampled_result compute the top-k; without, rank 0 does.
            signals = self._captured_rows(rows, full=full, top_k=0 if full else top_logits, hidden=return_hidden)
        except BaseException as error:
            # The chunks may be half-computed inside vLLM: those sequences cannot be trusted.
            for row in rows:
                self.release(row.seq_id)
            self._check_ranks(error)
            raise
        positions = []
        for row, new in zip(rows, tokens):
            self._lengths[row.seq_id] += len(new)
            positions.append(self._lengths[row.seq_id])
        if full:
            return sampled_result(rows, signals["logits"].float(), positions, top_logits, signals["hidden"],
                                  counts=self._context_counts, return_logits=return_logits)
        # Greedy rows with nothing processing their logits: our sampler's token is the argmax.
        return StepResult(seq_ids=[row.seq_id for row in rows], sampled=signals["argmax"].cpu().long(), logits=None,
                          positions=torch.tensor(positions, dtype=torch.int64), hidden=_cpu(signals["hidden"]),
                          topk_values=_cpu(signals["topk_values"]), topk_indices=_cpu(signals["topk_indices"]))

    def _check_ranks(self, cause: BaseException | None = None) -> None:
        """A tensor-parallel model that lost a rank cannot step again: vLLM's multiprocess executor
        sees the worker die and shuts itself down (``is_failed``)."""
        if getattr(self._executor, "is_failed", False):
            raise EngineLost(f"engine '{self.name}': a rank of its {self._tensor_parallel_size} tensor-parallel ranks "
                             f"died; the model cannot run again until it is restarted") from cause

    def _watch_ranks(self) -> None:
        """A dead rank takes its model's other ranks with it at once (rank_watch: otherwise the step
        waits about 10 s for vLLM to give up on them, and they outlive a stub that exits)."""
        executor = weakref.ref(self._executor)  # the watch must not keep a dropped engine's executor alive

        def closing() -> bool:  # vLLM's shutdown after a rank died sets both; a close only the first
            current = executor()
            return current is None or (getattr(current, "shutting_down", False) and not current.is_failed)

        kill_all_when_one_dies(self.name, [worker.proc for worker in self._executor.workers], closing)

    def record_sampler_logprobs(self, k: int) -> None:
        """From the next chunk on, ask vLLM's own sampler for each row's top-``k`` log-probabilities
        (``last_sampler_logprobs``; 0 stops). A diagnostic: the device check holds the captured
        logits to them, which proves the capture saw every row of every step (CUDA graphs included)."""
        if not 0 <= k <= MAX_SAMPLER_LOGPROBS:
            raise ValueError(f"k must be in [0, {MAX_SAMPLER_LOGPROBS}], got {k}")
        self._sampler_logprobs = k
        self._chunk_params = None  # the next chunk is processed again, with the new logprobs
        self.last_sampler_logprobs = {}

    def _record_sampler_logprobs(self, rows: Sequence[StepRow], outputs: dict[int, Any]) -> None:
        by_request = {output.request_id: output for batch in outputs.values() for output in batch.outputs}
        self.last_sampler_logprobs = {}
        for row in rows:
            output = by_request[self._request_ids[row.seq_id]]
            lists = output.new_logprobs  # [sampled token, top-k...] for the one position sampled
            tokens, values = lists.logprob_token_ids[0].tolist(), lists.logprobs[0].tolist()
            self.last_sampler_logprobs[row.seq_id] = (output.new_token_ids[0], dict(zip(tokens, values)))

    def _match_threads(self) -> None:
        if not getattr(self._thread_state, "done", False):
            # vLLM's CPU worker turns torch.set_num_threads into a no-op; call the setter beneath it.
            torch._C.set_num_threads(self._threads)
            self._thread_state.done = True

    def _check_capacity(self, rows: Sequence[StepRow], tokens: list[tuple[int, ...]]) -> None:
        """The contract: raise before anything changes when the pool cannot hold the step."""
        need = sum(self.blocks_for(self._lengths[row.seq_id] + len(new)) - self.blocks_for(self._lengths[row.seq_id])
                   for row, new in zip(rows, tokens))
        if need > self.num_free_blocks:
            raise KVCacheExhausted(f"engine '{self.name}': step needs {need} new blocks, {self.num_free_blocks} free")

    def _add_chunk(self, request_id: str, tokens: list[int], first: bool) -> None:
        """Queue ``tokens`` as the request's next input chunk. A first chunk goes through vLLM's
        input processor (validation, parameter setup); later chunks, decodes mostly, reuse its
        processed sampling parameters directly (the processor deep-copies them on every call)."""
        if first or self._chunk_params is None:
            from vllm import SamplingParams, TokensPrompt

            params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False, ignore_eos=True,
                                    logprobs=self._sampler_logprobs or None)
            request = self._llm.input_processor.process_inputs(
                request_id, TokensPrompt(prompt_token_ids=tokens), params, supported_tasks=("generate",),
                resumable=True)
            self._chunk_params = request.sampling_params
        else:
            from vllm.v1.engine import EngineCoreRequest

            request = EngineCoreRequest(
                request_id=request_id, prompt_token_ids=tokens, mm_features=None,
                sampling_params=self._chunk_params, pooling_params=None, arrival_time=time.time(),
                lora_request=None, cache_salt=None, data_parallel_rank=None, resumable=True)
        core_request, wave = self._core.preprocess_add_request(request)
        self._core.add_request(core_request, wave)

    def _check_scheduled(self, rows: Sequence[StepRow], tokens: list[tuple[int, ...]]) -> None:
        """Every row's whole chunk ran in this step (a split chunk would sample a wrong position)."""
        self.last_step_tokens = {row.seq_id: self._scheduled.get(self._request_ids[row.seq_id], 0) for row in rows}
        for row, new in zip(rows, tokens):
            if self.last_step_tokens[row.seq_id] != len(new):
                raise RuntimeError(f"engine '{self.name}': vLLM scheduled {self.last_step_tokens[row.seq_id]} of "
                                   f"{len(new)} tokens of {row.seq_id!r} (max_num_batched_tokens too small?)")

    def _captured_rows(self, rows: Sequence[StepRow], *, full: bool, top_k: int, hidden: bool) -> dict[str, Any]:
        """The step's rows' signals from rank 0, in the order the rows were given (vllm_capture)."""
        start = time.perf_counter()
        captured = self._rank0("tokenrouter_fetch", [self._request_ids[row.seq_id] for row in rows], full, top_k,
                               hidden, self._across_processes)
        self.last_fetch_s = time.perf_counter() - start
        if captured is None:
            raise RuntimeError(f"engine '{self.name}': vLLM ran no forward pass for the step")
        self.last_fetch_bytes = sum(tensor.nbytes for tensor in captured.values() if tensor is not None)
        return captured

    def _rank0(self, method: str, *args: Any) -> Any:
        """A worker-extension call (vllm_capture) on every rank; rank 0's answer."""
        reply = self._executor.collective_rpc(method, args=args, **self._one_reply)
        return reply if self._one_reply else reply[0]

    def _wrap_schedule(self) -> None:
        """Record how many tokens vLLM schedules per request in each step."""
        schedule = self._scheduler.schedule

        def recording_schedule(*args: Any, **kwargs: Any) -> Any:
            output = schedule(*args, **kwargs)
            self._scheduled = dict(output.num_scheduled_tokens)
            return output

        self._scheduler.schedule = recording_schedule

    def generate_natively(self, prompts: Sequence[Sequence[int]], max_tokens: int,
                          stop_token_ids: Sequence[int] = ()) -> tuple[list[list[int]], int]:
        """vLLM's own continuous-batching loop (what ``LLM.generate`` runs) on this engine's weights,
        greedy: the ceiling the step adapter is measured against, and the large-model-alone
        baseline. Stops at ``stop_token_ids`` (kept in the output, as our runtime keeps an eos) or
        after ``max_tokens``. Held sequences stay parked meanwhile. Returns (tokens per prompt, steps)."""
        from vllm import SamplingParams, TokensPrompt

        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, detokenize=False, ignore_eos=True,
                                stop_token_ids=list(stop_token_ids))
        ids = [f"{self.name}-native-{self._next_id + i}" for i in range(len(prompts))]
        self._next_id += len(prompts)
        for request_id, prompt in zip(ids, prompts):
            self._llm.add_request(request_id, TokensPrompt(prompt_token_ids=list(prompt)), params)
        outputs: dict[str, list[int]] = {}
        steps = 0
        while len(outputs) < len(ids):
            for output in self._llm.step():
                if output.finished:
                    outputs[output.request_id] = list(output.outputs[0].token_ids)
            steps += 1
        return [outputs[request_id] for request_id in ids], steps

    def close(self) -> None:
        for seq_id in list(self._lengths):
            self.release(seq_id)
        self._core.shutdown()


def engine_arguments(spec: ModelSpec, *, dtype: str, on_cpu: bool, max_position_embeddings: int) -> dict[str, Any]:
    """vLLM ``EngineArgs`` keywords for a spec (every name is checked against vLLM in vllm_compat)."""
    return dict(
        model=spec.path,
        dtype=dtype,
        # vLLM refuses a pool that cannot hold one request of max_model_len (whole blocks only).
        max_model_len=min(max_position_embeddings, spec.kv_cache_tokens // spec.block_size * spec.block_size),
        block_size=spec.block_size,
        # +1: vLLM reserves one null block; the rest is exactly the spec's pool, so admission
        # control (which computes capacities from specs) and the engine agree.
        num_gpu_blocks_override=spec.kv_cache_tokens // spec.block_size + 1,
        max_num_seqs=spec.max_batch_size,
        # A step never exceeds the subserver's prefill budget plus one token per decode row:
        # vLLM must schedule every row whole, never split a chunk across steps.
        max_num_batched_tokens=spec.max_prefill_tokens + spec.max_batch_size,
        enable_prefix_caching=False,  # sessions keep their own KV; no shared blocks to account
        # CUDA graphs stay on on GPU (most of vLLM's speed there): they capture the forward up to
        # the hidden states; compute_logits, which we wrap, runs after the graph, every step.
        enforce_eager=on_cpu,
        skip_tokenizer_init=True,  # token ids in, token ids out
        # vLLM's sampler computes log-probabilities only for requests that ask; ours ask only
        # when a diagnostic records them (record_sampler_logprobs).
        max_logprobs=MAX_SAMPLER_LOGPROBS,
        # One rank runs in this process; more run in vLLM's worker processes (its CPU backend too).
        tensor_parallel_size=spec.tensor_parallel_size,
        distributed_executor_backend="uni" if spec.tensor_parallel_size == 1 else "mp",
        worker_extension_cls=WORKER_EXTENSION,  # captures the per-row signals on rank 0 (vllm_capture)
        gpu_memory_utilization=spec.gpu_memory_utilization,
        seed=0,
        # Off on purpose (vLLM turns it on by default on GPU; its CPU backend forces it off): it
        # overlaps the next schedule with this forward, and we step the core one synchronous step
        # at a time; resumable sessions under it crashed the engine core until vLLM 0.31.
        async_scheduling=False,
    )


def rank_environment(name: str, spec: ModelSpec, *, on_cpu: bool) -> dict[str, str]:
    """Where the model's ranks run, checked against the hardware (``RankPlacementError`` names the
    field): on CPU each rank's OpenMP threads bound to its share of the cores (one rank: nothing to
    bind); on GPU the process sees only its ``tensor_parallel_size`` consecutive GPUs from the device's
    index on. vLLM takes no device argument (each rank uses the visible GPU of its local rank), so
    this is what puts a one-rank model on ``cuda:1``; one rank on GPU 0 is vLLM's default already."""
    if on_cpu:
        if spec.tensor_parallel_size == 1:
            return {}
        return {"VLLM_CPU_OMP_THREADS_BIND": omp_threads_bind(cpu_rank_cores(name, spec))}
    if spec.tensor_parallel_size == 1 and gpu_index(spec) == 0:
        return {}
    return {"CUDA_VISIBLE_DEVICES": ",".join(gpu_rank_devices(name, spec))}


def _cpu(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.cpu()


def _hf_config(path: str) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path, local_files_only=True)


def kv_bytes_per_token(hf_config: Any, dtype: str) -> int:
    """Keys + values of every layer for one token."""
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    return 2 * hf_config.num_hidden_layers * hf_config.num_key_value_heads * head_dim * _DTYPE_BYTES[dtype]
