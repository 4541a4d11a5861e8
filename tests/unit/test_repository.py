"""Rendering a model repository from a config and reading it back."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tokenrouter.config import ConfigError, load_config
from tritonclient.grpc import model_config_pb2 as mc
from tokenrouter.serving.repository import (
    ENSEMBLE, MARKER, read_model_config, read_repository, render_repository,
)

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
        "policy": {"name": "ensemble", "params": {"weights": {"small": 0.5, "large": 0.3, "sim": 0.2}, "carry_top_k": 8},
                   "weights": str(weights)},
        "scheduling": {"strategy": "eager_async", "max_wait_ms": 7.5, "max_active": 9},
        "chat_template": True,
        "max_model_len": 1024,
    }


def test_render_then_read_gives_the_same_config(tmp_path: Path) -> None:
    config = load_config(rich_config(tmp_path))
    repo = render_repository(config, tmp_path / "repo")
    back = read_repository(repo)
    copied = repo / "router" / "1" / "router.pt"
    assert back.policy.weights == str(copied) and copied.read_bytes() == b"weights"
    assert back == config.model_copy(update={"policy": config.policy.model_copy(update={"weights": str(copied)})})
    # the copy is the repository's own: rendering what was read changes nothing
    assert read_repository(render_repository(back, tmp_path / "repo2")) == back.model_copy(
        update={"policy": back.policy.model_copy(update={"weights": str(tmp_path / "repo2/router/1/router.pt")})})


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
    pbtxt = repo / "router" / "config.pbtxt"
    pbtxt.write_text(pbtxt.read_text().replace('string_value: "7.5"', 'string_value: "12"'))
    sub = repo / "large" / "config.pbtxt"
    sub.write_text(sub.read_text().replace('string_value: "auto"', 'string_value: "[1, 3]"'))
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
    trained = repo / "router" / "1" / "r2r"  # where `tokenrouter train-router` writes
    trained.mkdir()
    (trained / "metadata.json").write_text("{}")
    (repo / "router" / "1" / "router.pt").write_bytes(b"stale")  # the config's weights file wins
    render_repository(raw, tmp_path / "repo")
    assert (repo / "router" / "1" / "r2r" / "metadata.json").read_text() == "{}"
    assert (repo / "router" / "1" / "router.pt").read_bytes() == b"weights"


def test_refuses_to_replace_a_folder_it_did_not_render(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="not a rendered repository"):
        render_repository(rich_config(tmp_path), tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def _instance_groups(repo: Path, names: list[str]) -> dict[str, tuple[str, list[int]]]:
    groups = {name: read_model_config(repo / name).instance_group for name in names}
    return {name: (mc.ModelInstanceGroup.Kind.Name(group[0].kind), list(group[0].gpus)) for name, group in groups.items()}


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


def test_ensemble_wiring_is_consistent(tmp_path: Path) -> None:
    """Every step reads only ensemble inputs or earlier steps' outputs, by names its model declares."""
    repo = render_repository(rich_config(tmp_path), tmp_path / "repo")
    ensemble = read_model_config(repo / ENSEMBLE)
    available = {t.name for t in ensemble.input}
    for step in ensemble.ensemble_scheduling.step:
        model = read_model_config(repo / step.model_name)
        assert set(step.input_map) <= {t.name for t in model.input}
        assert set(step.input_map.values()) <= available
        assert set(step.output_map) <= {t.name for t in model.output}
        available |= set(step.output_map.values())
    assert {t.name for t in ensemble.output} <= available
    assert [s.model_name for s in ensemble.ensemble_scheduling.step][1] == "small"


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
    # what git keeps: trained routers that train-router wrote into router/1/ are ignored artifacts
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
