"""`tokenrouter models download`: which repositories, into which folders, with which files.

huggingface_hub is replaced by a recorder (no network here); what it is asked for is the contract.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from tokenrouter_engines import models
from tokenrouter_engines.hf_download import OFFICIAL_CHECKPOINTS, checkpoint_dir
from tokenrouter_engines.recipe import InstallError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def hub_calls(monkeypatch) -> list[dict]:
    calls: list[dict] = []

    def snapshot_download(repo_id, **kwargs):
        calls.append({"repo_id": repo_id, **kwargs})
        return str(kwargs["local_dir"])

    monkeypatch.setitem(sys.modules, "huggingface_hub", types.SimpleNamespace(snapshot_download=snapshot_download))
    return calls


def _run(*argv: str) -> int:
    import argparse

    parser = argparse.ArgumentParser()
    models.configure(parser)
    return models.run(parser.parse_args(list(argv)))


def test_download_fetches_both_official_repositories_into_hf_folders(tmp_path, hub_calls, capsys) -> None:
    assert _run("download", "--dest", str(tmp_path)) == 0
    assert [call["repo_id"] for call in hub_calls] == ["Qwen/Qwen2.5-Coder-0.5B-Instruct",
                                                      "Qwen/Qwen2.5-Coder-1.5B-Instruct"]
    assert [call["local_dir"] for call in hub_calls] == [tmp_path / "hf" / "Qwen2.5-Coder-0.5B-Instruct",
                                                         tmp_path / "hf" / "Qwen2.5-Coder-1.5B-Instruct"]
    patterns = hub_calls[0]["allow_patterns"]
    assert "*.safetensors" in patterns and "*.json" in patterns and "*.gguf" not in patterns
    printed = capsys.readouterr().out.splitlines()
    assert printed == [f"{member}\t{checkpoint_dir(tmp_path, member)}" for member in OFFICIAL_CHECKPOINTS]


def test_download_one_model_of_the_pair_at_a_revision(tmp_path, hub_calls) -> None:
    assert _run("download", "--dest", str(tmp_path), "--only", "large", "--revision", "v1") == 0
    assert [(c["repo_id"], c["revision"]) for c in hub_calls] == [("Qwen/Qwen2.5-Coder-1.5B-Instruct", "v1")]


def test_an_unknown_model_of_the_pair_is_refused_before_any_download(tmp_path, hub_calls, capsys) -> None:
    assert _run("download", "--dest", str(tmp_path), "--only", "huge") == 1
    assert hub_calls == [] and "unknown model(s) ['huge'] of the pair" in capsys.readouterr().err
    with pytest.raises(InstallError):
        from tokenrouter_engines.hf_download import download_official
        download_official(tmp_path, ["huge"])


# The default pair's GPU configs; the tensor-parallel ones (32B, 72B) name their own checkpoints in their headers.
@pytest.mark.parametrize("config", sorted((ROOT / "configs").glob("qwen2.5-coder*gpu*.yaml")), ids=lambda p: p.name)
def test_gpu_configs_point_at_the_downloaded_folders(config: Path) -> None:
    from tokenrouter.config import load_config

    loaded = load_config(config)
    default_models = ROOT / "engines" / "build" / "models"
    expected = {checkpoint_dir(default_models, member).resolve() for member in OFFICIAL_CHECKPOINTS}
    assert {Path(spec.path).resolve() for spec in loaded.models.values()} == expected
