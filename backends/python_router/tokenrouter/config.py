"""The one YAML config: models, engine settings, policy, delayed-batching thresholds, strategy.

Validated with pydantic so that every error names the field and what is allowed. Model order
in ``models`` is the model index used everywhere (attribution, routing matrices).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Literal, Union, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .runtime.strategies import STRATEGY_CLASSES

# The one table of scheduling strategies (runtime/strategies.py builds them, in this order: asserted
# below) and the one table of engines (engine/factory.py builds them and asserts that it covers these).
StrategyName = Literal["tokenrouter", "eager_async", "model_sync", "step_sync"]
STRATEGIES: tuple[str, ...] = get_args(StrategyName)
assert STRATEGIES == tuple(STRATEGY_CLASSES), "config.STRATEGIES and runtime/strategies.py's table disagree"
EngineName = Literal["vllm", "torch", "simulated", "tensorrt_llm"]
ENGINE_KINDS: tuple[str, ...] = get_args(EngineName)
TENSOR_PARALLEL_ENGINES = ("vllm", "tensorrt_llm")  # the engines that split a model over ranks

Threshold = Union[int, list[int], Literal["auto"]]


class ConfigError(ValueError):
    """A config that cannot run; the message names the field and what is allowed."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelSpec(_Strict):
    """One subserver: its engine and its batching knobs."""

    path: str | None = Field(None, description="HF safetensors directory or a .gguf file (torch engine)")
    engine: EngineName = "torch"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto: bfloat16 for vllm on CPUs with AMX/AVX-512 BF16, the checkpoint's on GPU, "
                            "float32 for the torch engine (the exact oracle) and otherwise",
    )
    device: str = Field("cpu", description="cpu, cuda, cuda:N or auto")
    threads: int | None = Field(None, ge=1, description="intra-op threads for this engine; default: torch's")
    cpus: list[int] | None = Field(
        None, description="CPU cores this model's process is pinned to (vllm engine; default: not pinned)"
    )
    block_size: int = Field(
        16, ge=1, le=1024,  # _engine_defaults fills it in first: 32 for vllm
        description="tokens per KV block; default 32 for vllm (its CPU attention needs a multiple of 32), else 16",
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="vllm on GPU: share of the GPU's memory this engine may take"
    )
    tensor_parallel_size: int = Field(
        1, ge=1, le=64, description="ranks the model is split over (vllm, tensorrt_llm): on GPU that many GPUs from "
                                    "the device's index on; on CPU (vllm) the model's cores split among the ranks"
    )
    kv_cache_tokens: int = Field(16384, ge=16, description="KV pool capacity in tokens")
    max_batch_size: int = Field(16, ge=1)
    max_prefill_tokens: int = Field(4096, ge=1, description="prefill/extend tokens per step")
    batch_threshold: Threshold = Field(
        1, description="delayed batching B: an int, a list indexed by active count N (N=1 first), or auto"
    )
    profile: dict[str, Any] | str | None = Field(None, description="simulated engine: step-latency profile")
    server: str | None = Field(
        None, description="HOST:PORT of the Triton server (its gRPC port) that runs this model, as the other "
                          "servers reach it; unset on every model: all in one server (docs/deploy.md, two hosts)"
    )

    @model_validator(mode="before")
    @classmethod
    def _engine_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("block_size") is None:
            data = {**data, "block_size": 32 if data.get("engine") == "vllm" else 16}
        return data

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if value in ("cpu", "cuda", "auto") or (value.startswith("cuda:") and value[5:].isdigit()):
            return value
        raise ValueError(f"'{value}' is not a device; allowed: cpu, cuda, cuda:N, auto")

    @field_validator("server")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is None:
            return value
        host, _, port = value.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"'{value}' is not HOST:PORT (the gRPC address of the Triton server that runs this model)")
        return value

    @field_validator("batch_threshold")
    @classmethod
    def _threshold(cls, value: Threshold) -> Threshold:
        values = [value] if isinstance(value, int) else value if isinstance(value, list) else []
        if isinstance(value, list) and not value:
            raise ValueError("an empty list; give at least the threshold for N=1")
        if any(b < 1 for b in values):
            raise ValueError(f"thresholds must be >= 1, got {value}")
        return value

    @model_validator(mode="after")
    def _needs_path(self) -> "ModelSpec":
        if self.engine in ("vllm", "torch", "tensorrt_llm") and not self.path:
            raise ValueError(f"engine '{self.engine}' needs 'path' (an HF directory or a .gguf file)")
        if self.engine == "vllm" and self.device in ("cpu", "auto") and self.block_size % 32:
            raise ValueError(f"engine 'vllm' on CPU needs block_size a multiple of 32 (vLLM's CPU attention), "
                             f"got {self.block_size}")
        if self.cpus is not None and (not self.cpus or any(c < 0 for c in self.cpus)):
            raise ValueError(f"cpus must be a non-empty list of core numbers, got {self.cpus}")
        if self.tensor_parallel_size > 1 and self.engine not in TENSOR_PARALLEL_ENGINES:
            raise ValueError(f"tensor_parallel_size {self.tensor_parallel_size}: engine '{self.engine}' runs a model "
                             f"on one device; tensor parallelism needs engine {' or '.join(TENSOR_PARALLEL_ENGINES)}")
        if (self.tensor_parallel_size > 1 and self.engine == "vllm" and self.device == "cpu"
                and self.cpus is not None and len(self.cpus) < self.tensor_parallel_size):
            raise ValueError(f"tensor_parallel_size {self.tensor_parallel_size} on CPU needs a core per rank; "
                             f"cpus gives {len(self.cpus)}")
        if self.engine == "simulated" and self.profile is None:
            raise ValueError("engine 'simulated' needs 'profile' (a profile name or a dict)")
        return self

    def threshold_at(self, active: int) -> int | None:
        """B for ``active`` concurrent requests; None when the threshold is 'auto'."""
        threshold = self.batch_threshold
        return None if isinstance(threshold, str) else fixed_threshold(threshold, active)  # str: only 'auto'


def fixed_threshold(threshold: int | list[int], active: int) -> int:
    """B for ``active`` concurrent requests under a fixed threshold: an int, or a list indexed by N
    (N=1 first; the last entry holds beyond)."""
    return threshold if isinstance(threshold, int) else threshold[min(active, len(threshold)) - 1]


class PolicySpec(_Strict):
    """The routing policy carried by the routing_policy model."""

    name: str = "slm_only"
    params: dict[str, Any] = Field(default_factory=dict)
    weights: str | None = Field(None, description="directory or file with the policy's trained weights")

    @field_validator("name")
    @classmethod
    def _known(cls, value: str) -> str:
        from .policies.base import registered_policies  # the registry imports torch: only when validating

        known = registered_policies()
        if value not in known:
            raise ValueError(f"unknown policy '{value}'; allowed: {', '.join(sorted(known))}")
        return value

    @model_validator(mode="after")
    def _params(self) -> "PolicySpec":
        """Each policy's own parameter model checks ``params``: a typo fails here, naming the field."""
        from .policies.base import registered_policies

        registered_policies()[self.name].parse_params(self.params)
        return self


class SchedulingSpec(_Strict):
    strategy: StrategyName = "tokenrouter"
    max_wait_ms: float = Field(
        20.0, ge=0, description="longest a runnable request waits for its batch threshold (no starvation)"
    )
    max_active: int = Field(16, ge=1, description="most requests active at once (N); more wait in the queue")
    max_queue: int = Field(
        256, ge=0, description="most requests waiting for admission; one more is refused at once as 'server busy'"
    )
    queue_timeout_s: float = Field(
        0.0, ge=0, description="a request not admitted within this many seconds ends with an error (0: no limit)"
    )
    max_bypass: int = Field(
        8, ge=0, description="how many later requests whose KV fits may start ahead of a waiting one (0: strict FIFO)"
    )
    max_responses_per_s: float = Field(
        400.0, gt=0, description="streamed responses per second the entry sends over all streams (Triton): each "
                                  "stream's are at least streams/this apart, tokens in between leave together; the "
                                  "first token and the last response are never held"
    )


FRONT_NAMES = ("tokenrouter", "ensemble", "tensorrt_llm_bls")  # ours, and TensorRT-LLM's model names
RESERVED_NAMES = ("preprocessing", "postprocessing", "routing_policy", "tensorrt_llm")


class FrontendSpec(_Strict):
    """The client-facing models (fronts): their names, Triton's transaction mode, the batch size."""

    names: list[str] = Field(default_factory=lambda: list(FRONT_NAMES), min_length=1,
                             description="a front model under each name; all behave the same")
    decoupled: bool = Field(True, description="true: streaming (one response per chunk when stream is true); "
                                              "false: unary, one response per request (gRPC ModelInfer, HTTP /infer)")
    max_batch_size: int = Field(64, ge=1, description="rows per request; each row is its own generation")
    exclude_input_in_output: bool = Field(
        False, description="what a request that does not send exclude_input_in_output gets: false (TensorRT-LLM's "
                           "default) starts a non-streaming text_output with the prompt; true, as Triton's OpenAI "
                           "frontend needs (its chat requests never send the input)")
    # Fan-out bounds, checked before anything is allocated: one request must never grow a front
    # without limit (num_return_sequences 2**31 once took a front to 2.5 GB and the server down).
    max_return_sequences: int = Field(16, ge=1, description="num_return_sequences per row")
    max_generations: int = Field(64, ge=1, description="generations per request: rows x num_return_sequences")
    max_words: int = Field(1024, ge=1, description="words per row in each of stop_words, bad_words, "
                                                   "embedding_bias_words")
    # Synthetic load tools (TensorRT-LLM's benchmark_core_model.py token-norm-dist, token-from-histogram) send
    # random ids up to 2**31-1; TensorRT-LLM takes ids past the vocabulary as prompt-table ids, so they run there.
    out_of_vocabulary_ids: Literal["refuse", "wrap"] = Field(
        "refuse", description="what tensorrt_llm (the core model) does with an input id >= the vocabulary size: "
                              "refuse the request naming input_ids, or wrap it to id mod vocabulary size (for load "
                              "tools that send random ids; the output is meaningless text). Negative ids are "
                              "always refused")
    # TensorRT-LLM streams one token per response, and tools that count responses as tokens rely on it;
    # the entry's pacing (scheduling.max_responses_per_s) merges tokens where many streams run. The
    # fronts under TensorRT-LLM's names stream as TensorRT-LLM does (docs/config.md: the measurement).
    one_token_per_response: list[str] = Field(
        default_factory=lambda: ["ensemble", "tensorrt_llm_bls"],
        description="the fronts whose streams carry one token per response, as TensorRT-LLM's; the others' "
                    "responses are paced (scheduling.max_responses_per_s) and may carry several")

    @field_validator("names")
    @classmethod
    def _valid_names(cls, names: list[str]) -> list[str]:
        for name in names:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
                raise ValueError(f"'{name}' is not a model folder name (letters, digits, '_', '.', '-')")
            if name in RESERVED_NAMES:
                raise ValueError(f"'{name}' is taken by the repository's own {name} model")
        if len(set(names)) != len(names):
            raise ValueError(f"names repeat: {names}")
        return names

    @model_validator(mode="after")
    def _known_fronts(self) -> "FrontendSpec":
        unknown = [name for name in self.one_token_per_response if name not in self.names]
        if unknown and "one_token_per_response" in self.model_fields_set:
            raise ValueError(f"one_token_per_response: {unknown} are not in names {self.names}")
        if unknown:  # the default names TensorRT-LLM's fronts, which a config may leave out
            self.one_token_per_response = [name for name in self.one_token_per_response if name in self.names]
        return self


class TransportSpec(_Strict):
    """How subservers on different Triton servers reach each other (models with a ``server``)."""

    down_after_s: float = Field(
        1.0, gt=0, description="a peer that acknowledges nothing for this long is down: the requests away at it "
                               "end with an error and the entry refuses new ones until it is back")
    delay_ms: float = Field(0.0, ge=0, description="added to every peer message before it is sent (measurements "
                                                   "and tests: a network's latency on loopback)")


class TokenRouterConfig(_Strict):
    models: dict[str, ModelSpec]
    # "" only when `models` is refused too: _entry_defaults_to_the_first_model names the first model
    entry: str = Field("", description="model that admits requests; default: the first model")
    policy: PolicySpec = Field(default_factory=PolicySpec)
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    tokenizer: str | None = Field(None, description="tokenizer directory or .gguf; default: the entry model's path")
    chat_template: bool = Field(False, description="wrap prompts in the tokenizer's chat template")
    max_model_len: int | None = Field(None, ge=2, description="prompt + output cap; default: smallest model limit")
    frontend: FrontendSpec = Field(default_factory=FrontendSpec)
    transport: TransportSpec = Field(default_factory=TransportSpec)

    @field_validator("models")
    @classmethod
    def _at_least_two(cls, value: dict[str, ModelSpec]) -> dict[str, ModelSpec]:
        if len(value) < 2:
            raise ValueError(f"token-level routing needs at least 2 models, got {len(value)}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _entry_defaults_to_the_first_model(cls, data: Any) -> Any:
        """An entry left out (or null) is the first model, filled in before validation so that a valid
        config's ``entry`` is always a model's name."""
        if not isinstance(data, dict) or data.get("entry") is not None:
            return data
        models = data.get("models")
        first = next(iter(models), None) if isinstance(models, dict) else None
        rest = {key: value for key, value in data.items() if key != "entry"}
        return rest if first is None else {**rest, "entry": first}

    @model_validator(mode="after")
    def _cross_checks(self) -> "TokenRouterConfig":
        names = list(self.models)
        if self.entry not in self.models:
            raise ValueError(f"entry: '{self.entry}' is not a model; allowed: {', '.join(names)}")
        for name in names:
            if name in RESERVED_NAMES:
                raise ValueError(f"models.{name}: the repository has its own '{name}' model; rename this one")
            if name in self.frontend.names:
                raise ValueError(f"models.{name}: a front model has that name (frontend.names); rename one of them")
        if self.scheduling.strategy == "tokenrouter":
            check_thresholds(self.models, self.scheduling.max_active)
        unplaced = [name for name, spec in self.models.items() if spec.server is None]
        if unplaced and len(unplaced) < len(names):
            raise ValueError(f"models {', '.join(unplaced)} name no server while others do: in a deployment over "
                             f"several servers every model says where it runs (models.<name>.server: HOST:PORT)")
        return self

    @property
    def model_names(self) -> list[str]:
        return list(self.models)

    @property
    def tokenizer_path(self) -> str | None:
        return self.tokenizer or self.models[self.entry].path


def check_thresholds(models: dict[str, ModelSpec], max_active: int) -> None:
    """Reject thresholds that can deadlock: need sum(B_i - 1) < N for every N up to max_active.

    With sum(B_i - 1) >= N every model may hold fewer requests than its threshold while all N
    requests wait, and no batch ever starts.
    """
    for active in range(1, max_active + 1):
        fixed = {name: b for name, spec in models.items() if (b := spec.threshold_at(active)) is not None}
        if len(fixed) < len(models):
            continue  # 'auto' picks thresholds under the same constraint at run time
        slack = sum(b - 1 for b in fixed.values())
        if slack >= active:
            raise ValueError(
                f"batch_threshold can deadlock at N={active} active requests: "
                f"sum(B_i - 1) = {slack} >= N with B = {fixed}; "
                f"give a list indexed by N (e.g. [1, 2, 2, 3]) so that sum(B_i - 1) < N for every N "
                f"up to scheduling.max_active={max_active}"
            )


def _resolve_paths(raw: dict[str, Any], base: Path) -> dict[str, Any]:
    """Relative model/tokenizer/weights paths are relative to the config file's folder."""

    def fix(value: Any) -> Any:
        if isinstance(value, str) and value and not Path(value).is_absolute():
            return str((base / value).resolve())
        return value

    raw = copy.deepcopy(raw)
    models = raw.get("models")
    for spec in models.values() if isinstance(models, dict) else ():  # not a mapping: validation names it
        if isinstance(spec, dict) and "path" in spec:
            spec["path"] = fix(spec["path"])
    if "tokenizer" in raw:
        raw["tokenizer"] = fix(raw["tokenizer"])
    policy = raw.get("policy")
    if isinstance(policy, dict) and policy.get("weights"):
        policy["weights"] = fix(policy["weights"])
    return raw


def _format_errors(err: ValidationError) -> str:
    lines = []
    for item in err.errors():
        where = ".".join(str(part) for part in item["loc"]) or "config"
        lines.append(f"{where}: {item['msg'].removeprefix('Value error, ')}")
    return "invalid config:\n  " + "\n  ".join(lines)


def load_config(source: str | Path | dict[str, Any] | TokenRouterConfig) -> TokenRouterConfig:
    """Load and validate a config from a YAML path, a dict or an existing config."""
    if isinstance(source, TokenRouterConfig):
        return source
    if isinstance(source, dict):
        raw, base = source, Path.cwd()
    else:
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        raw, base = yaml.safe_load(path.read_text()) or {}, path.parent
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
    try:
        return TokenRouterConfig.model_validate(_resolve_paths(raw, base))
    except ValidationError as err:
        raise ConfigError(_format_errors(err)) from None
