"""The Triton model repository, both ways: render it from a TokenRouterConfig, read it back.

Layout (one folder per Triton model)::

    tokenrouter/      python: a front (what clients call; also ensemble/, tensorrt_llm_bls/: frontend.names),
                      TensorRT-LLM's interface -> the entry subserver by BLS -> text (front_model.py)
    tensorrt_llm/     python: TensorRT-LLM's core model, token ids -> the entry -> token ids (front/core_model.py)
    preprocessing/    python, standalone: TensorRT-LLM's preprocessing (QUERY, ... -> INPUT_ID, ...)
    postprocessing/   python, standalone: TensorRT-LLM's postprocessing (TOKENS_BATCH, SEQUENCE_LENGTH -> OUTPUT)
    <model>/          python_router, role "subserver": one per config model (ModelSpec as parameters)
    routing_policy/   python_router, role "routing_policy": policy, scheduling and the policy's weights in 1/

A config whose models run on several servers (placement.py) renders one repository per node: that
node's subservers, the routing_policy model (which names the node's models in ``served_here`` and
holds the other nodes' model specs in ``remote_models``), and the fronts only on the entry's node.

Every setting is a string ``parameter`` in a config.pbtxt, so editing it and restarting Triton (under
``tokenrouter serve``: SIGHUP, a drained restart) takes effect: the models read their settings
back with :func:`read_repository`. Relative paths in parameters are relative to the repository
folder (``policy_weights``: to routing_policy/1/), so a repository and its models can move together.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from ..config import ConfigError, FrontendSpec, ModelSpec, TokenRouterConfig, load_config
from ..placement import node_models
from ..runtime.strategies import MULTI_PROCESS
from .schema import (CLIENT_INPUTS, CLIENT_OUTPUTS, CONTROL_INPUTS, CORE_MODEL_INPUTS, CORE_MODEL_OUTPUTS,
                     EXCLUDE_INPUT, ONE_TOKEN_PER_RESPONSE, OUT_OF_VOCABULARY, POSTPROCESSING_INPUTS,
                     POSTPROCESSING_OUTPUTS, PREPROCESSING_INPUTS, PREPROCESSING_OUTPUTS, ROUTING_POLICY_OUTPUTS,
                     SUBSERVER_INPUTS, SUBSERVER_OUTPUTS, Tensor)

PREPROCESSING = "preprocessing"
POSTPROCESSING = "postprocessing"
ROUTING_POLICY = "routing_policy"  # carries the policy, its weights and the scheduling settings
CORE_MODEL = "tensorrt_llm"  # TensorRT-LLM's core model: token ids in, token ids out (front/core_model.py)
LEGACY_ROUTING_POLICY = "router"  # its name and role before the rename (re-rendering carries its trained routers)
ROUTER_BACKEND = "python_router"
INSTANCE_KINDS = ("KIND_CPU", "KIND_GPU", "KIND_MODEL")
# The subservers take one request per Triton request; batching is on (max_batch_size > 0) as in
# TensorRT-LLM's models, so [1, n]-shaped tensors and HTTP generate's JSON scalars (which Triton
# turns into [1, 1]) both fit. The subservers batch across requests on their own (delayed
# batching), not through Triton. The fronts take frontend.max_batch_size rows.
MAX_BATCH_SIZE = 1
MARKER = ".tokenrouter-repository"  # marks a folder that rendering may replace wholesale

HEADER = (
    "# Rendered by `tokenrouter build-repository`. Edit `parameters` and restart Triton (under\n"
    "# `tokenrouter serve`: kill -HUP its pid, which drains and restarts tritonserver).\n"
    "# Relative paths are relative to the repository folder.\n"
)
REQUIRED_INPUTS = frozenset({"input_ids"})  # the fronts name a missing input themselves


def _add_tensors(config: mc.ModelConfig, inputs: Iterable[Tensor], outputs: Iterable[Tensor],
                 required: frozenset[str]) -> None:
    for t in inputs:
        config.input.add(name=t.name, data_type=mc.DataType.Value(t.config_type), dims=t.dims,
                         optional=t.name not in required)
    for t in outputs:
        config.output.add(name=t.name, data_type=mc.DataType.Value(t.config_type), dims=t.dims)


def _encode(value: Any) -> str:
    """Parameter values are strings: text as is, None as "", anything else as JSON."""
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _decode(raw: str, text: bool) -> Any:
    if raw == "":
        return None
    if text:
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw  # a word in a non-text field, e.g. batch_threshold "auto"; validation judges it


def _is_text(annotation: Any) -> bool:
    """Whether a field holds only text (its parameter is then never JSON-decoded)."""
    if annotation is str:
        return True
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return all(isinstance(a, str) for a in args)
    if origin in (typing.Union, types.UnionType):
        return all(_is_text(a) for a in args)
    return False


@dataclass(frozen=True)
class _Paths:
    """Paths as written into a repository at ``base``: relative to it, or absolute."""

    base: Path
    relative: bool = True

    def encode(self, path: str | Path | None) -> str:
        if path is None:
            return ""
        return os.path.relpath(Path(path).resolve(), self.base) if self.relative else str(Path(path).resolve())

    def decode(self, raw: str) -> str | None:
        return None if raw == "" else str((self.base / raw).resolve())


def repository_path(raw: str, repo_dir: Path) -> str | None:
    """A path parameter made absolute (relative ones are relative to ``repo_dir``); "" is None."""
    return _Paths(Path(repo_dir)).decode(raw)


def model_config(name: str, *, backend: str = "", platform: str = "", max_batch_size: int = MAX_BATCH_SIZE,
                 inputs: Iterable[Tensor] = (), outputs: Iterable[Tensor] = (),
                 parameters: Mapping[str, Any] | None = None, decoupled: bool = False,
                 instance_kind: str | None = "KIND_CPU", gpus: Iterable[int] = (),
                 required: frozenset[str] = REQUIRED_INPUTS) -> mc.ModelConfig:
    """One model's config.pbtxt contents; parameters are encoded as strings. Inputs not ``required``
    are optional (the models name a missing one themselves)."""
    config = mc.ModelConfig(name=name, backend=backend, platform=platform, max_batch_size=max_batch_size)
    _add_tensors(config, inputs, outputs, required)
    for key, value in (parameters or {}).items():
        config.parameters[key].string_value = _encode(value)
    if decoupled:
        config.model_transaction_policy.decoupled = True
    if instance_kind is not None:
        if instance_kind not in INSTANCE_KINDS:
            raise ConfigError(f"instance kind '{instance_kind}' is not one of {', '.join(INSTANCE_KINDS)}")
        config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.Kind.Value(instance_kind), gpus=list(gpus))
    return config


def instance_kind_for(device: str) -> str:
    """The instance group kind a model on ``device`` needs: KIND_GPU for ``cuda``/``cuda:N``.

    ``auto`` stays KIND_CPU: Triton refuses to load a KIND_GPU instance on a host without GPUs, and
    an ``auto`` config must load on both (the engine still picks CUDA when it is there).
    """
    return "KIND_GPU" if device.startswith("cuda") else "KIND_CPU"


def subserver_config(name: str, parameters: Mapping[str, Any], *, backend: str = ROUTER_BACKEND,
                     instance_kind: str | None = None, device: str = "cpu") -> mc.ModelConfig:
    """A subserver: decoupled, the subserver tensor interface, one instance (it batches itself).

    ``instance_kind`` None derives it from ``device``; KIND_GPU pins the device's GPU (``cuda`` is GPU 0).
    """
    instance_kind = instance_kind or instance_kind_for(device)
    gpus = [int(device.partition(":")[2] or 0)] if instance_kind == "KIND_GPU" else []
    return model_config(name, backend=backend, inputs=SUBSERVER_INPUTS.values(), outputs=SUBSERVER_OUTPUTS.values(),
                        parameters={**parameters, "role": "subserver"}, decoupled=True,
                        instance_kind=instance_kind, gpus=gpus)


def write_model(repo_dir: Path, config: mc.ModelConfig, files: Mapping[str, str | Path] | None = None) -> Path:
    """Write ``<repo>/<name>/config.pbtxt`` and version 1 (``files``: name -> text or a path to copy)."""
    model_dir = Path(repo_dir) / config.name
    version = model_dir / "1"
    version.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(HEADER + text_format.MessageToString(config))
    if not files:
        (version / ".gitkeep").write_text("")  # Triton needs the version folder; git keeps no empty one
    for name, content in (files or {}).items():
        target = version / name
        if isinstance(content, Path):
            (shutil.copytree if content.is_dir() else shutil.copy2)(content, target)
        else:
            target.write_text(content)
    return model_dir


def _shim(module: str) -> str:
    """A model.py that re-exports a model class from the package (the code lives in one place)."""
    return (
        f'"""Triton loads this file; the model lives in the tokenrouter package."""\n\n'
        f"from {module} import TritonPythonModel  # noqa: F401\n"
    )


FAN_OUT_LIMITS = ("max_return_sequences", "max_generations", "max_words")  # FrontendSpec's, front parameters


def render_frontend(repo_dir: Path, *, entry: str, tokenizer: str, chat_template: bool,
                    max_model_len: int | None = None, frontend: FrontendSpec | None = None) -> None:
    """The fronts (what clients call) and the standalone preprocessing and postprocessing, in
    front of subserver ``entry``.

    ``tokenizer`` is written as given (relative paths are relative to the repository folder).
    ``max_model_len`` (None: the model folder's limit) sizes the byte cap on text; parameter
    ``max_input_bytes`` overrides the cap.
    """
    frontend = frontend or FrontendSpec()
    text = {"tokenizer": tokenizer, "chat_template": chat_template, "max_model_len": max_model_len,
            "max_input_bytes": None}
    limits = {name: getattr(frontend, name) for name in FAN_OUT_LIMITS}
    shared = {**text, **limits, EXCLUDE_INPUT: frontend.exclude_input_in_output, "entry": entry}
    for name in frontend.names:
        write_front(repo_dir, name, {**shared, ONE_TOKEN_PER_RESPONSE: name in frontend.one_token_per_response},
                    decoupled=frontend.decoupled, max_batch_size=frontend.max_batch_size)
    # TensorRT-LLM's core model streams one token per response, and so does this one
    write_core_model(repo_dir, CORE_MODEL, {**shared, ONE_TOKEN_PER_RESPONSE: True,
                                            OUT_OF_VOCABULARY: frontend.out_of_vocabulary_ids},
                     decoupled=frontend.decoupled, max_batch_size=frontend.max_batch_size)
    pre = model_config(PREPROCESSING, backend="python", inputs=PREPROCESSING_INPUTS.values(),
                       outputs=PREPROCESSING_OUTPUTS.values(), parameters={**text, "max_words": frontend.max_words},
                       max_batch_size=frontend.max_batch_size, required=frozenset())
    write_model(repo_dir, pre, {"model.py": _shim("tokenrouter.serving.text.preprocessing_model")})
    post = model_config(POSTPROCESSING, backend="python", inputs=POSTPROCESSING_INPUTS.values(),
                        outputs=POSTPROCESSING_OUTPUTS.values(), max_batch_size=frontend.max_batch_size,
                        parameters={"tokenizer": tokenizer, "max_model_len": max_model_len}, required=frozenset())
    write_model(repo_dir, post, {"model.py": _shim("tokenrouter.serving.text.postprocessing_model")})


def write_core_model(repo_dir: Path, name: str, parameters: Mapping[str, Any], *, decoupled: bool,
                     max_batch_size: int) -> Path:
    """TensorRT-LLM's core model (front/core_model.py) under ``name``: a front's ``parameters``, TensorRT-LLM's
    core tensors, every input optional (the model names a missing one, as a front does)."""
    config = model_config(name, backend="python", max_batch_size=max_batch_size,
                          inputs=[*CORE_MODEL_INPUTS.values(), *CONTROL_INPUTS.values()],
                          outputs=CORE_MODEL_OUTPUTS.values(), parameters={**parameters, "role": "core_model"},
                          decoupled=decoupled, required=frozenset())
    return write_model(repo_dir, config, {"model.py": _shim("tokenrouter.serving.front.core_model")})


def write_front(repo_dir: Path, name: str, parameters: Mapping[str, Any], *, decoupled: bool,
                max_batch_size: int) -> Path:
    """A front model: TensorRT-LLM's client interface, one instance (it runs every request on
    threads of its own), decoupled or unary (``decoupled: ${decoupled_mode}`` in TensorRT-LLM).
    ``parameters``: ``entry`` and the text parameters (tokenizer, chat_template, max_model_len,
    max_input_bytes), as another front's config.pbtxt holds them."""
    config = model_config(name, backend="python", max_batch_size=max_batch_size,
                          inputs=[*CLIENT_INPUTS.values(), *CONTROL_INPUTS.values()],
                          outputs=CLIENT_OUTPUTS.values(), parameters={**parameters, "role": "front"},
                          decoupled=decoupled)
    return write_model(repo_dir, config, {"model.py": _shim("tokenrouter.serving.front.front_model")})


def _spec_parameters(spec: ModelSpec, paths: _Paths) -> dict[str, Any]:
    values = spec.model_dump()
    values["path"] = paths.encode(spec.path) if spec.path else None
    return values


def _routing_policy_config(config: TokenRouterConfig, weights: str, here: list[str]) -> mc.ModelConfig:
    parameters = {
        "role": "routing_policy",
        "models": config.model_names,
        "entry": config.entry,
        "policy": config.policy.name,
        "policy_params": config.policy.params,
        "policy_weights": weights,
        "strategy": config.scheduling.strategy,
        "max_wait_ms": config.scheduling.max_wait_ms,
        "max_active": config.scheduling.max_active,
        "max_queue": config.scheduling.max_queue,
        "queue_timeout_s": config.scheduling.queue_timeout_s,
        "max_bypass": config.scheduling.max_bypass,
        "max_responses_per_s": config.scheduling.max_responses_per_s,
        "max_model_len": config.max_model_len,
        "fronts": config.frontend.names,
        "served_here": here,
        "remote_models": {name: spec.model_dump() for name, spec in config.models.items() if name not in here},
        "transport": config.transport.model_dump(),
    }
    return model_config(ROUTING_POLICY, backend=ROUTER_BACKEND, max_batch_size=0,
                        outputs=ROUTING_POLICY_OUTPUTS.values(), parameters=parameters)


def render_repository(config: TokenRouterConfig | str | Path | dict[str, Any], out_dir: Path, *,
                      instance_kind: str | None = None, relative_paths: bool = True,
                      only: list[str] | None = None) -> Path:
    """Write a complete model repository for ``config`` into ``out_dir`` and return its path.

    ``out_dir`` is replaced as a whole (it must be empty, absent, or an earlier rendering), so a
    model dropped from the config does not linger. The policy's weights are copied into
    routing_policy/1/; trained routers already in the earlier rendering's routing_policy/1/ stay there.
    ``instance_kind`` applies to the subservers; None (the default, and what ``serve --config`` uses)
    derives each one's kind from its model's ``device`` (KIND_GPU pins the device's GPU).
    ``only``: the models of one node of a config placed over several servers (placement.py); None: all.
    """
    config = load_config(config)
    here = node_models(config, only)
    out_dir = Path(out_dir).resolve()
    if config.scheduling.strategy not in MULTI_PROCESS:
        raise ConfigError(
            f"scheduling.strategy: '{config.scheduling.strategy}' coordinates the models through memory they share; "
            f"Triton runs each model in its own process, so it cannot serve it. Use "
            f"{' or '.join(repr(s) for s in MULTI_PROCESS)}, or run '{config.scheduling.strategy}' in the embedded "
            f"API (TokenRouter), e.g. for a comparison")
    if config.tokenizer_path is None:
        raise ConfigError("the repository needs a tokenizer: set `tokenizer` or a `path` on the entry model")
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / MARKER).is_file():
        raise ConfigError(f"{out_dir} is not empty and is not a rendered repository; refusing to replace it")
    paths = _Paths(out_dir, relative_paths)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        if config.entry in here:
            render_frontend(staging, entry=config.entry, tokenizer=paths.encode(config.tokenizer_path),
                            chat_template=config.chat_template, max_model_len=config.max_model_len,
                            frontend=config.frontend)
        for name, spec in config.models.items():
            if name not in here:
                continue
            sub = subserver_config(name, _spec_parameters(spec, paths), instance_kind=instance_kind, device=spec.device)
            write_model(staging, sub)
        weights = Path(config.policy.weights) if config.policy.weights else None
        files = {weights.name: weights} if weights else {}
        write_model(staging, _routing_policy_config(config, weights.name if weights else "", here), files)
        _keep_trained_routers(out_dir / ROUTING_POLICY / "1", staging / ROUTING_POLICY / "1")
        # Rendered before the rename (or a checkout where git removed router/config.pbtxt but not the
        # ignored trained routers beside it): they move into routing_policy/1/. Only folders move, and
        # no other model keeps folders in its 1/, so a model now named router loses nothing.
        _keep_trained_routers(out_dir / LEGACY_ROUTING_POLICY / "1", staging / ROUTING_POLICY / "1")
        node = f"the node of {', '.join(here)} at {config.models[here[0]].server}" if here != config.model_names \
            else "one server running every model"
        (staging / MARKER).write_text(f"Rendered by `tokenrouter build-repository` for {node}; rendering again "
                                      f"replaces this folder.\n")
        _replace(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def _keep_trained_routers(old: Path, new: Path) -> None:
    """Carry the router folders of an earlier rendering (what `train-router` writes into routing_policy/1/,
    minutes of training each) into the new one, unless the config's weights take that name.
    Hard links: no copy of R2R's ~280 MB, and the earlier rendering stays whole until replaced.
    An earlier copy of the same name wins over a later one (routing_policy/1/ over router/1/)."""
    if not old.is_dir():
        return
    for folder in old.iterdir():
        if folder.is_dir() and not (new / folder.name).exists():
            shutil.copytree(folder, new / folder.name, copy_function=os.link)


def _is_legacy_routing_policy(repo_dir: Path) -> bool:
    """Whether ``repo_dir`` holds the routing policy model under its old name (``router``, role "router")."""
    try:
        return model_parameters(repo_dir / LEGACY_ROUTING_POLICY).get("role") == LEGACY_ROUTING_POLICY
    except ConfigError:
        return False


def _replace(new: Path, old: Path) -> None:
    """Put ``new`` where ``old`` is, with no moment where half of each is there."""
    if not old.exists():
        new.rename(old)
        return
    trash = Path(tempfile.mkdtemp(prefix=f".{old.name}-old-", dir=old.parent))
    old.rename(trash / old.name)
    new.rename(old)
    shutil.rmtree(trash, ignore_errors=True)


def read_model_config(model_dir: Path) -> mc.ModelConfig:
    path = Path(model_dir) / "config.pbtxt"
    if not path.is_file():
        raise ConfigError(f"{path} does not exist")
    try:
        return text_format.Parse(path.read_text(), mc.ModelConfig())
    except text_format.ParseError as err:
        raise ConfigError(f"{path}: {err}") from None


def model_parameters(model_dir: Path, role: str | None = None) -> dict[str, str]:
    """A model's parameters as raw strings; checks its ``role`` when one is given."""
    config = read_model_config(model_dir)
    params = {key: value.string_value for key, value in config.parameters.items()}
    if role is not None and params.get("role") != role:
        raise ConfigError(f"{model_dir}/config.pbtxt: parameter role is '{params.get('role')}', expected '{role}'")
    return params


def _require(params: Mapping[str, str], key: str, where: Path) -> str:
    if key not in params:
        raise ConfigError(f"{where}/config.pbtxt: parameter '{key}' is missing")
    return params[key]


def _read_spec(params: dict[str, str], paths: _Paths) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    for key, raw in params.items():
        if key == "role":
            continue
        field = ModelSpec.model_fields.get(key)
        # an unknown key goes through as text so that validation names it
        spec[key] = paths.decode(raw) if key == "path" else _decode(raw, field is None or _is_text(field.annotation))
    return {key: value for key, value in spec.items() if value is not None}


def read_repository(repo_dir: Path) -> TokenRouterConfig:
    """The TokenRouterConfig that a repository's config.pbtxt files describe (paths made absolute)."""
    repo_dir = Path(repo_dir).resolve()
    paths = _Paths(repo_dir)
    policy_dir = repo_dir / ROUTING_POLICY
    if not (policy_dir / "config.pbtxt").is_file() and _is_legacy_routing_policy(repo_dir):
        raise ConfigError(f"{repo_dir} was rendered before the '{LEGACY_ROUTING_POLICY}' model was renamed "
                          f"'{ROUTING_POLICY}': render it again with `tokenrouter build-repository` (trained routers "
                          f"in {LEGACY_ROUTING_POLICY}/1/ are carried over)")
    policy_model = model_parameters(policy_dir, "routing_policy")

    def json_param(key: str) -> Any:
        return _decode(_require(policy_model, key, policy_dir), text=False)

    names = json_param("models")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"{policy_dir}/config.pbtxt: parameter 'models' must be a JSON list of model names")
    remote = _decode(policy_model.get("remote_models", ""), text=False) or {}
    models = {name: remote[name] if name in remote
              else _read_spec(model_parameters(repo_dir / name, "subserver"), paths) for name in names}
    weights = _require(policy_model, "policy_weights", policy_dir)
    entry = _require(policy_model, "entry", policy_dir) or None
    fronts = json_param("fronts")
    # the entry's node has the fronts and the text models; another node's repository only names them
    fronts_here = isinstance(fronts, list) and bool(fronts) and (repo_dir / fronts[0]).is_dir()
    first_front = read_model_config(repo_dir / fronts[0]) if fronts_here else None
    pre_dir = repo_dir / PREPROCESSING
    pre = model_parameters(pre_dir) if fronts_here or pre_dir.is_dir() else {}
    tokenizer = paths.decode(_require(pre, "tokenizer", pre_dir)) if pre else None
    raw = {
        "models": models,
        "entry": entry,
        "policy": {
            "name": _require(policy_model, "policy", policy_dir),
            "params": json_param("policy_params") or {},
            "weights": str((policy_dir / "1" / weights).resolve()) if weights else None,
        },
        "scheduling": {
            "strategy": _require(policy_model, "strategy", policy_dir),
            "max_wait_ms": json_param("max_wait_ms"),
            "max_active": json_param("max_active"),
            "max_queue": json_param("max_queue"),
            "queue_timeout_s": json_param("queue_timeout_s"),
            "max_bypass": json_param("max_bypass"),
            "max_responses_per_s": json_param("max_responses_per_s"),
        },
        # the default (the entry model's own tokenizer) reads back as the default
        "tokenizer": None if tokenizer == models.get(entry or next(iter(models), ""), {}).get("path") else tokenizer,
        "chat_template": _decode(_require(pre, "chat_template", pre_dir), text=False) if pre else False,
        "max_model_len": json_param("max_model_len"),
        "transport": _decode(policy_model.get("transport", ""), text=False) or {},
        # the first front's config speaks for all (each front reads its own mode from its own config)
        "frontend": {"names": fronts, "decoupled": first_front.model_transaction_policy.decoupled,
                     ONE_TOKEN_PER_RESPONSE: [name for name in fronts if _decode(model_parameters(
                         repo_dir / name).get(ONE_TOKEN_PER_RESPONSE, "false"), text=False) is True],
                     "max_batch_size": first_front.max_batch_size,
                     **{name: int(first_front.parameters[name].string_value) for name in FAN_OUT_LIMITS
                        if name in first_front.parameters},
                     **({EXCLUDE_INPUT: _decode(first_front.parameters[EXCLUDE_INPUT].string_value, text=False)}
                        if EXCLUDE_INPUT in first_front.parameters else {}),
                     **_core_model_settings(repo_dir)} if first_front else {"names": fronts},
    }
    return load_config(raw)


def _core_model_settings(repo_dir: Path) -> dict[str, str]:
    """The frontend settings only the core model reads, from its config (none where it has none)."""
    if not (repo_dir / CORE_MODEL / "config.pbtxt").is_file():
        return {}
    value = model_parameters(repo_dir / CORE_MODEL).get(OUT_OF_VOCABULARY)
    return {OUT_OF_VOCABULARY: value} if value else {}


def served_models(repo_dir: Path) -> list[str]:
    """The models the server of this repository runs (the others run on other servers): all of them
    unless it was rendered for one node (``render_repository(..., only=...)``)."""
    policy_model = model_parameters(Path(repo_dir) / ROUTING_POLICY, "routing_policy")
    here = _decode(policy_model.get("served_here", ""), text=False)
    return here if isinstance(here, list) else _decode(_require(policy_model, "models", repo_dir), text=False)
