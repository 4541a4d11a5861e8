"""Rendering a model repository from a config and reading it back."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tritonclient.grpc import model_config_pb2 as mc

from tokenrouter.config import FRONT_NAMES, ConfigError, load_config
from tokenrouter.serving.repository import (MARKER, model_parameters, read_model_config, read_repository,
                                           render_repository)

ROOT = Path(__file__).resolve().parents[2]


def rich_config(tmp_path: Path) -> dict:
    weights = tmp_path / "src" / "router.pt"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"weights")
    (tmp_path / "models" / "a").mkdir(parents=True)
    (tmp_path / "models" / "b").mkdir(parents=True)
    return {
        "models": {
            "small": {"path": str(tmp_path / "models/a"), "batch_threshold": [1, 2, 2], "threads": 2,
                      "dtype": "bfloat16"},
            "large": {"path": str(tmp_path / "models/b"), "batch_threshold": "auto", "device": "cuda:1"},
            "sim": {"engine": "simulated", "profile": {"decode_ms": [3.5, 4.0], "name": "x"}},
        },
        "entry": "small",
        "policy": {"name": "ensemble",
                   "params": {"weights": {"small": 0.5, "large": 0.3, "sim": 0.2}, "carry_top_k": 8},
                   "weights": str(weights)},
        "scheduling": {"strategy": "eager_async", "max_wait_ms": 7.5, "max_active": 9},
        "chat_template": True,
        "max_model_len": 1024,
        # non-default fan-out limits and input default: they must travel through the fronts' parameters and back
        "frontend": {"max_return_sequences": 3, "max_generations": 5, "max_words": 7, "exclude_input_in_output": True,
                     "out_of_vocabulary_ids": "wrap"},
    }


def test_render_then_read_gives_the_same_config(tmp_path: Path) -> None:
    config = load_config(rich_config(tmp_path))
    repo = render_repository(config, tmp_path / "repo")
    back = read_repository(repo)
    copied = repo / "routing_policy" / "1" / "router.pt"
    assert back.policy.weights == str(copied) and copied.read_bytes() == b"weights"
    assert back == config.model_copy(update={"policy": config.policy.model_copy(update={"weights": str(copied)})})
    # the copy is the repository's own: rendering what was read changes nothing
    moved = back.policy.model_copy(update={"weights": str(tmp_path / "repo2/routing_policy/1/router.pt")})
    assert read_repository(render_repository(back, tmp_path / "repo2")) == back.model_copy(update={"policy": moved})


def test_out_of_vocabulary_ids_reach_the_core_model_alone(tmp_path: Path) -> None:
    raw = rich_config(tmp_path)
    repo = render_repository(load_config(raw), tmp_path / "repo")
    assert model_parameters(repo / "tensorrt_llm")["out_of_vocabulary_ids"] == "wrap"
    assert all("out_of_vocabulary_ids" not in model_parameters(repo / name) for name in FRONT_NAMES)
    default = render_repository(load_config({**raw, "frontend": {}}), tmp_path / "default")
    assert model_parameters(default / "tensorrt_llm")["out_of_vocabulary_ids"] == "refuse"


def test_explicit_tokenizer_and_defaults_round_trip(tmp_path: Path) -> None:
    raw = rich_config(tmp_path)
    raw.update(tokenizer=str(tmp_path / "models/b"), max_model_len=None, chat_template=False)
    del raw["policy"]["weights"]
    config = load_config(raw)
    assert read_repository(render_repository(config, tmp_path / "repo")) == config


def test_paths_are_relative_so_repository_and_models_move_together(tmp_path: Path) -> None:
    config = load_config(rich_config(tmp_path))
    render_repository(config, tmp_path / "repo")
    params = read_model_config(tmp_path / "repo" / "small").parameters
    assert params["path"].string_value == "../models/a"
    shutil.move(tmp_path, tmp_path.parent / (tmp_path.name + "-moved"))
    moved = tmp_path.parent / (tmp_path.name + "-moved")
    assert read_repository(moved / "repo").models["small"].path == str(moved / "models/a")


def test_absolute_paths_on_request(tmp_path: Path) -> None:
    render_repository(rich_config(tmp_path), tmp_path / "repo", relative_paths=False)
    assert read_model_config(tmp_path / "repo" / "small").parameters["path"].string_value == str(tmp_path / "models/a")


def test_edited_parameter_takes_effect(tmp_path: Path) -> None:
    repo = render_repository(rich_config(tmp_path), tmp_path / "repo")
    pbtxt = repo / "routing_policy" / "config.pbtxt"
    pbtxt.write_text(pbtxt.read_text().replace('string_value: "7.5"', 'string_value: "12"'))
    sub = repo / "large" / "config.pbtxt"
    threshold = 'key: "batch_threshold"\n  value {\n    string_value: '
    sub.write_text(sub.read_text().replace(threshold + '"auto"', threshold + '"[1, 3]"'))
    config = read_repository(repo)
    assert config.scheduling.max_wait_ms == 12.0
    assert config.models["large"].batch_threshold == [1, 3]


def test_a_bad_edit_is_named(tmp_path: Path) -> None:
    repo = render_repository(rich_config(tmp_path), tmp_path / "repo")
    sub = repo / "small" / "config.pbtxt"
    sub.write_text(sub.read_text().replace('key: "block_size"', 'key: "blok_size"'))
    with pytest.raises(ConfigError, match="models.small.blok_size"):
        read_repository(repo)
    sub.write_text("name: broken {")
    with pytest.raises(ConfigError, match="small/config.pbtxt"):
        read_repository(repo)


def test_rendering_again_replaces_the_repository(tmp_path: Path) -> None:
    raw = rich_config(tmp_path)
    render_repository(raw, tmp_path / "repo")
    del raw["models"]["sim"]
    render_repository(raw, tmp_path / "repo")
    assert not (tmp_path / "repo" / "sim").exists()
    assert (tmp_path / "repo" / MARKER).is_file()


def test_rendering_again_keeps_trained_routers(tmp_path: Path) -> None:
    raw = rich_config(tmp_path)
    repo = render_repository(raw, tmp_path / "repo")
    trained = repo / "routing_policy" / "1" / "r2r"  # where `tokenrouter train-router` writes
    trained.mkdir()
    (trained / "metadata.json").write_text("{}")
    (repo / "routing_policy" / "1" / "router.pt").write_bytes(b"stale")  # the config's weights file wins
    render_repository(raw, tmp_path / "repo")
    assert (repo / "routing_policy" / "1" / "r2r" / "metadata.json").read_text() == "{}"
    assert (repo / "routing_policy" / "1" / "router.pt").read_bytes() == b"weights"


def test_rendering_a_repository_from_before_the_rename_keeps_its_trained_routers(tmp_path: Path) -> None:
    """The routing_policy model was called `router`: its trained routers move to routing_policy/1/,
    and reading such a repository says to render it again."""
    raw = rich_config(tmp_path)
    repo = render_repository(raw, tmp_path / "repo")
    old = repo / "router"
    (repo / "routing_policy").rename(old)
    pbtxt = old / "config.pbtxt"
    pbtxt.write_text(pbtxt.read_text().replace('string_value: "routing_policy"', 'string_value: "router"'))
    (old / "1" / "r2r").mkdir()
    (old / "1" / "r2r" / "metadata.json").write_text("{}")
    with pytest.raises(ConfigError, match="render it again"):
        read_repository(repo)
    render_repository(raw, tmp_path / "repo")
    assert not old.exists()
    assert (repo / "routing_policy" / "1" / "r2r" / "metadata.json").read_text() == "{}"
    assert read_repository(repo).policy.weights == str(repo / "routing_policy" / "1" / "router.pt")


def test_trained_routers_left_in_router_1_by_a_checkout_are_carried_over(tmp_path: Path) -> None:
    """What a checkout holds after pulling the rename: git removed router/config.pbtxt and added
    routing_policy/, but the ignored trained routers stay in router/1/."""
    raw = rich_config(tmp_path)
    repo = render_repository(raw, tmp_path / "repo")
    (repo / "router" / "1" / "co_llm").mkdir(parents=True)
    (repo / "router" / "1" / "co_llm" / "metadata.json").write_text("{}")
    render_repository(raw, tmp_path / "repo")
    assert not (repo / "router").exists()
    assert (repo / "routing_policy" / "1" / "co_llm" / "metadata.json").read_text() == "{}"


def test_refuses_to_replace_a_folder_it_did_not_render(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="not a rendered repository"):
        render_repository(rich_config(tmp_path), tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def _instance_groups(repo: Path, names: list[str]) -> dict[str, tuple[str, list[int]]]:
    groups = {name: read_model_config(repo / name).instance_group for name in names}
    return {name: (mc.ModelInstanceGroup.Kind.Name(group[0].kind), list(group[0].gpus))
            for name, group in groups.items()}


def test_instance_kinds_follow_each_models_device(tmp_path: Path) -> None:
    """What `serve --config` renders: cuda:N pins GPU N, cuda GPU 0, cpu and auto stay KIND_CPU."""
    config = rich_config(tmp_path)
    config["models"]["sim"]["device"] = "cuda"
    config["models"]["auto"] = {**config["models"]["sim"], "device": "auto"}
    repo = render_repository(config, tmp_path / "repo")
    assert _instance_groups(repo, ["small", "large", "sim", "auto"]) == {
        "small": ("KIND_CPU", []), "large": ("KIND_GPU", [1]), "sim": ("KIND_GPU", [0]), "auto": ("KIND_CPU", [])}


def test_an_explicit_instance_kind_applies_to_every_subserver(tmp_path: Path) -> None:
    config = rich_config(tmp_path)
    repo = render_repository(config, tmp_path / "repo", instance_kind="KIND_CPU")
    assert _instance_groups(repo, ["small", "large"]) == {"small": ("KIND_CPU", []), "large": ("KIND_CPU", [])}
    render_repository(config, tmp_path / "repo", instance_kind="KIND_GPU")
    assert _instance_groups(repo, ["small", "large"]) == {"small": ("KIND_GPU", [0]), "large": ("KIND_GPU", [1])}
    with pytest.raises(ConfigError, match="instance kind"):
        render_repository(config, tmp_path / "repo", instance_kind="KIND_TPU")


# TensorRT-LLM's client interface (tensorrtllm_backend c2e65b88, inflight_batcher_llm: the union of
# ensemble/ and tensorrt_llm_bls/), written out here apart from schema.py so that a missing or
# mistyped input there fails this test: name -> (data type, dims).
TRT_LLM_INPUTS = {
    "text_input": ("TYPE_STRING", [1]), "decoder_text_input": ("TYPE_STRING", [1]),
    "image_input": ("TYPE_FP16", [-1, 3, -1, -1]), "image_bytes_input": ("TYPE_UINT8", [-1, -1, -1, -1]),
    "image_url_input": ("TYPE_STRING", [1]), "video_bytes_input": ("TYPE_UINT8", [-1, -1, -1, -1]),
    "max_tokens": ("TYPE_INT32", [1]), "num_return_sequences": ("TYPE_INT32", [1]),
    "bad_words": ("TYPE_STRING", [-1]), "stop_words": ("TYPE_STRING", [-1]),
    "exclude_input_in_output": ("TYPE_BOOL", [1]), "end_id": ("TYPE_INT32", [1]), "pad_id": ("TYPE_INT32", [1]),
    "top_k": ("TYPE_INT32", [1]), "top_p": ("TYPE_FP32", [1]), "temperature": ("TYPE_FP32", [1]),
    "length_penalty": ("TYPE_FP32", [1]), "repetition_penalty": ("TYPE_FP32", [1]), "min_tokens": ("TYPE_INT32", [1]),
    "presence_penalty": ("TYPE_FP32", [1]), "frequency_penalty": ("TYPE_FP32", [1]), "seed": ("TYPE_UINT64", [1]),
    "return_log_probs": ("TYPE_BOOL", [1]), "return_context_logits": ("TYPE_BOOL", [1]),
    "return_generation_logits": ("TYPE_BOOL", [1]), "return_perf_metrics": ("TYPE_BOOL", [1]),
    "beam_width": ("TYPE_INT32", [1]), "stream": ("TYPE_BOOL", [1]),
    "prompt_embedding_table": ("TYPE_FP16", [-1, -1]), "prompt_table_extra_id": ("TYPE_UINT64", [1]),
    "prompt_vocab_size": ("TYPE_INT32", [1]), "embedding_bias_words": ("TYPE_STRING", [-1]),
    "embedding_bias_weights": ("TYPE_FP32", [-1]), "num_draft_tokens": ("TYPE_INT32", [1]),
    "use_draft_logits": ("TYPE_BOOL", [1]), "lora_task_id": ("TYPE_UINT64", [1]),
    "lora_weights": ("TYPE_FP16", [-1, -1]), "lora_config": ("TYPE_INT32", [-1, 3]),
    "guided_decoding_guide_type": ("TYPE_STRING", [1]), "guided_decoding_guide": ("TYPE_STRING", [1]),
}
TRT_LLM_OUTPUTS = {
    "text_output": ("TYPE_STRING", [-1]), "cum_log_probs": ("TYPE_FP32", [-1]),
    "output_log_probs": ("TYPE_FP32", [-1, -1]), "context_logits": ("TYPE_FP32", [-1, -1]),
    "generation_logits": ("TYPE_FP32", [-1, -1, -1]), "batch_index": ("TYPE_INT32", [1]),
    "sequence_index": ("TYPE_INT32", [1]), "kv_cache_alloc_new_blocks": ("TYPE_INT32", [1]),
    "kv_cache_reused_blocks": ("TYPE_INT32", [1]), "kv_cache_alloc_total_blocks": ("TYPE_INT32", [1]),
    "arrival_time_ns": ("TYPE_INT64", [1]), "first_scheduled_time_ns": ("TYPE_INT64", [1]),
    "first_token_time_ns": ("TYPE_INT64", [1]), "last_token_time_ns": ("TYPE_INT64", [1]),
    "acceptance_rate": ("TYPE_FP32", [1]), "total_accepted_draft_tokens": ("TYPE_INT32", [1]),
    "total_draft_tokens": ("TYPE_INT32", [1]),
}

# What Triton's OpenAI frontend adds to every request and reads for `usage` (server main, 2026-08:
# python/openai/openai_frontend/engine/utils/triton.py reads INT32 or UINT32 counts).
OPENAI_FRONTEND_INPUTS = {"return_num_input_tokens": ("TYPE_BOOL", [1]), "return_num_output_tokens": ("TYPE_BOOL", [1])}
OPENAI_FRONTEND_OUTPUTS = {"num_input_tokens": ("TYPE_INT32", [1]), "num_output_tokens": ("TYPE_INT32", [1])}


def _tensors(tensors) -> dict[str, tuple[str, list[int]]]:
    return {t.name: (mc.DataType.Name(t.data_type), list(t.dims)) for t in tensors}


@pytest.mark.parametrize("front", FRONT_NAMES)
def test_every_front_declares_tensorrt_llms_whole_interface(front: str, tmp_path: Path) -> None:
    """Every input TensorRT-LLM's ensemble and tensorrt_llm_bls declare, with its dtype and dims
    (end_id takes several ids here: [-1] holds TensorRT-LLM's [1]), all optional so that the front
    names what is missing; every output; and ours."""
    config = read_model_config(render_repository(rich_config(tmp_path), tmp_path / "repo") / front)
    inputs, outputs = _tensors(config.input), _tensors(config.output)
    for name, (dtype, dims) in TRT_LLM_INPUTS.items():
        assert inputs[name] == (dtype, [-1] if name == "end_id" else dims), name
    assert not any(t.optional is False for t in config.input)
    assert {name: outputs[name] for name in TRT_LLM_OUTPUTS} == TRT_LLM_OUTPUTS
    assert {name: inputs[name] for name in OPENAI_FRONTEND_INPUTS} == OPENAI_FRONTEND_INPUTS
    assert {name: outputs[name] for name in OPENAI_FRONTEND_OUTPUTS} == OPENAI_FRONTEND_OUTPUTS
    assert {"output_ids", "output_models", "finish_reason", "large_model_share"} <= set(outputs)
    assert config.model_transaction_policy.decoupled and config.max_batch_size == 64
    assert read_model_config(tmp_path / "repo" / front).parameters["entry"].string_value == "small"


@pytest.mark.parametrize("decoupled", [True, False])
def test_tensorrt_llm_declares_the_core_model_tensors_in_the_fronts_mode(tmp_path: Path, decoupled: bool) -> None:
    """TensorRT-LLM's core model: its inputs and outputs, every input optional (the model names a missing
    one), decoupled or unary as the fronts (TensorRT-LLM's ``decoupled: ${decoupled_mode}``)."""
    from tokenrouter.serving.schema import CONTROL_INPUT, CORE_MODEL_INPUTS, CORE_MODEL_OUTPUTS

    raw = rich_config(tmp_path)
    raw["frontend"] = {"decoupled": decoupled, "max_batch_size": 4}
    config = read_model_config(render_repository(raw, tmp_path / "repo") / "tensorrt_llm")
    assert config.model_transaction_policy.decoupled == decoupled and config.backend == "python"
    assert config.max_batch_size == 4 and not any(t.optional is False for t in config.input)
    assert [t.name for t in config.input] == [*CORE_MODEL_INPUTS, CONTROL_INPUT]  # the launcher's calls
    assert [t.name for t in config.output] == list(CORE_MODEL_OUTPUTS)
    assert config.parameters["one_token_per_response"].string_value == "true"


def test_front_names_mode_and_batch_size_come_from_the_config_and_read_back(tmp_path: Path) -> None:
    raw = rich_config(tmp_path)
    raw["frontend"] = {"names": ["llm_front", "ensemble"], "decoupled": False, "max_batch_size": 4}
    repo = render_repository(raw, tmp_path / "repo")
    assert (repo / "llm_front").is_dir() and (repo / "ensemble").is_dir() and not (repo / "tokenrouter").exists()
    config = read_model_config(repo / "llm_front")
    assert not config.model_transaction_policy.decoupled and config.max_batch_size == 4
    assert read_repository(repo).frontend == load_config(raw).frontend


@pytest.mark.parametrize(("change", "message"), [
    ({"frontend": {"names": ["routing_policy"]}},
     "frontend.names: .*'routing_policy' is taken by the repository's own routing_policy"),
    ({"frontend": {"names": ["tensorrt_llm"]}},
     "frontend.names: .*'tensorrt_llm' is taken by the repository's own tensorrt_llm"),
    ({"frontend": {"names": ["a", "a"]}}, "frontend.names: .*names repeat"),
    ({"frontend": {"names": ["tokenrouter"], "one_token_per_response": ["ensemble"]}},
     r"frontend: .*one_token_per_response: \['ensemble'\] are not in names \['tokenrouter'\]"),
    ({"frontend": {"names": ["bad/name"]}}, "frontend.names: .*'bad/name' is not a model folder name"),
    ({"frontend": {"names": []}}, "frontend.names"),
    ({"frontend": {"names": ["small"]}}, "models.small: a front model has that name"),
    ({"frontend": {"out_of_vocabulary_ids": "fold"}}, r"frontend.out_of_vocabulary_ids: .*'refuse' or 'wrap'"),
])
def test_frontend_values_that_cannot_be_served_are_refused_by_field(change: dict, message: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config({**rich_config(tmp_path), **change})


# How TensorRT-LLM's ensemble (c2e65b88) wires preprocessing -> tensorrt_llm -> postprocessing
ENSEMBLE_WIRING = {"INPUT_ID": "input_ids", "REQUEST_INPUT_LEN": "input_lengths",
                   "REQUEST_OUTPUT_LEN": "request_output_len", "DECODER_INPUT_ID": "decoder_input_ids",
                   "REQUEST_DECODER_INPUT_LEN": "decoder_input_lengths",
                   "BAD_WORDS_IDS": "bad_words_list", "STOP_WORDS_IDS": "stop_words_list",
                   "EMBEDDING_BIAS": "embedding_bias", "OUT_END_ID": "end_id", "OUT_PAD_ID": "pad_id",
                   "output_ids": "TOKENS_BATCH", "sequence_length": "SEQUENCE_LENGTH"}


def test_the_text_models_feed_the_core_model_and_the_front_speaks_the_subserver_interface() -> None:
    """preprocessing's outputs fit tensorrt_llm's inputs and tensorrt_llm's outputs postprocessing's, as
    TensorRT-LLM's ensemble wires them (same dtype; dims alike but where TensorRT-LLM's differ too); the
    front sends only subserver inputs, each of its declared dtype (one schema, no second list)."""
    from tokenrouter.protocol import RequestSpec
    from tokenrouter.serving.front.front_request import Generation
    from tokenrouter.serving.schema import (CORE_MODEL_INPUTS, CORE_MODEL_OUTPUTS, POSTPROCESSING_INPUTS,
                                            PREPROCESSING_OUTPUTS, SPEC_SCALARS, SUBSERVER_INPUTS)

    sources = {**PREPROCESSING_OUTPUTS, **CORE_MODEL_OUTPUTS}
    targets = {**CORE_MODEL_INPUTS, **POSTPROCESSING_INPUTS}
    for source, target in ENSEMBLE_WIRING.items():
        assert sources[source].datatype == targets[target].datatype, (source, target)
    assert set(PREPROCESSING_OUTPUTS) <= set(ENSEMBLE_WIRING) and set(POSTPROCESSING_INPUTS) <= {
        ENSEMBLE_WIRING["output_ids"], ENSEMBLE_WIRING["sequence_length"]}
    assert set(SPEC_SCALARS) <= set(RequestSpec.__dataclass_fields__)
    sent = Generation(0, 0, [1, 2], RequestSpec(prompt_len=2, max_tokens=3, logit_bias=[(4, 1.5)]), True,
                      False).entry_inputs()
    assert set(sent) <= set(SUBSERVER_INPUTS) - {"peer_message"}
    for name, array in sent.items():
        assert array.dtype == SUBSERVER_INPUTS[name].numpy and array.shape[0] == 1, name


@pytest.mark.parametrize("config", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_config_renders_and_reads_back(config: Path, tmp_path: Path) -> None:
    loaded = load_config(config)
    assert read_repository(render_repository(loaded, tmp_path / "repo")) == loaded


def test_committed_repository_is_what_the_default_config_renders(tmp_path: Path) -> None:
    """model_repository/ == `tokenrouter build-repository configs/qwen2.5-coder.yaml model_repository`."""
    # the same layout under tmp_path, so relative paths come out as they are in the checkout
    (tmp_path / "configs").mkdir()
    shutil.copy(ROOT / "configs" / "qwen2.5-coder.yaml", tmp_path / "configs")
    rendered = render_repository(tmp_path / "configs" / "qwen2.5-coder.yaml", tmp_path / "model_repository")
    committed = ROOT / "model_repository"
    files = sorted(p.relative_to(rendered) for p in rendered.rglob("*") if p.is_file())
    # what git keeps: trained routers that train-router wrote into routing_policy/1/ are ignored artifacts
    kept = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "model_repository"],
                          cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert files == sorted(Path(p).relative_to("model_repository") for p in kept)
    for path in files:
        assert (committed / path).read_text() == (rendered / path).read_text(), path
    assert read_repository(committed) == load_config(ROOT / "configs" / "qwen2.5-coder.yaml")


@pytest.mark.parametrize("strategy", ["step_sync", "model_sync"])
def test_a_strategy_triton_cannot_serve_is_refused_at_render(strategy: str, tmp_path: Path) -> None:
    """Catches the old behaviour: the repository rendered fine and Triton refused it at load."""
    raw = rich_config(tmp_path)
    raw["scheduling"]["strategy"] = strategy
    with pytest.raises(ConfigError) as caught:
        render_repository(raw, tmp_path / "repo")
    message = str(caught.value)
    assert f"scheduling.strategy: '{strategy}'" in message and "'tokenrouter' or 'eager_async'" in message
    assert "embedded API" in message and not (tmp_path / "repo").exists()
