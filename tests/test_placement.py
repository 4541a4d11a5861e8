"""Placement: a config whose models run on several Triton servers, its per-node repositories, and
the check that two nodes were given the same deployment (placement.py, repository.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from config_changes import changed
from tokenrouter.config import ConfigError, load_config
from tokenrouter.placement import describe, differences, node_models, nodes
from tokenrouter.serving.repository import read_repository, render_repository, served_models

SLM_AT, LLM_AT = "node-1:8001", "node-2:8001"


def split(pair: dict[str, Path], **changes) -> dict:
    config = {"models": {"slm": {"path": str(pair["small"]), "server": SLM_AT},
                         "llm": {"path": str(pair["large"]), "server": LLM_AT, "kv_cache_tokens": 2048}},
              "policy": {"name": "random", "params": {"rate": 0.3, "seed": 1}},
              "scheduling": {"max_active": 8}}
    return changed(config, changes)


def test_a_config_is_one_server_unless_its_models_name_servers(tiny_pair):
    assert nodes(load_config(split(tiny_pair, **{"models.slm.server": None, "models.llm.server": None}))) == {}
    assert nodes(load_config(split(tiny_pair))) == {SLM_AT: ["slm"], LLM_AT: ["llm"]}


@pytest.mark.parametrize("changes, error", [
    ({"models.slm.server": None}, "models slm name no server while others do"),
    ({"models.llm.server": "node-2"}, "'node-2' is not HOST:PORT"),
    ({"models.llm.server": "node-2:99999"}, "is not HOST:PORT"),
    ({"transport.tls_root_certificates": "ca.pem"}, "tls_root_certificates"),  # gone: a tunnel's job
])
def test_placement_errors_name_the_field(tiny_pair, changes, error):
    with pytest.raises(ConfigError, match=error):
        load_config(split(tiny_pair, **changes))


def test_only_names_one_whole_node(tiny_pair):
    three = split(tiny_pair)
    three["models"]["mid"] = {"path": str(tiny_pair["large"]), "server": LLM_AT}
    config = load_config(three)
    assert node_models(config, None) == ["slm", "llm", "mid"] and node_models(config, ["mid", "llm"]) == ["llm", "mid"]
    for only, error in ((["llm"], "share server node-2:8001: serve them together"),
                        (["slm", "llm"], "run on different servers"), (["big"], "not a model of this config")):
        with pytest.raises(ConfigError, match=error):
            node_models(config, only)
    with pytest.raises(ConfigError, match="needs a config whose models say where they run"):
        node_models(load_config(split(tiny_pair, **{"models.slm.server": None, "models.llm.server": None})), ["slm"])


def test_each_node_renders_its_own_models_and_the_fronts_go_with_the_entry(tiny_pair, tmp_path):
    """Catches a node that would load the other node's model (and its weights), fronts on a node
    without the entry, and a repository that cannot say which node it is for or read its peers back."""
    config = load_config(split(tiny_pair))
    entry = render_repository(config, tmp_path / "slm", only=["slm"])
    large = render_repository(config, tmp_path / "llm", only=["llm"])

    def models(repo: Path) -> list[str]:
        return sorted(p.name for p in repo.iterdir() if (p / "config.pbtxt").is_file())

    assert models(entry) == ["ensemble", "postprocessing", "preprocessing", "routing_policy", "slm",
                             "tensorrt_llm", "tensorrt_llm_bls", "tokenrouter"]
    assert models(large) == ["llm", "routing_policy"]
    assert "for the node of llm at node-2:8001" in (large / ".tokenrouter-repository").read_text()
    assert served_models(entry) == ["slm"] and served_models(large) == ["llm"]
    for repo in (entry, large):  # every node reads the whole deployment back, the other node's model included
        back = read_repository(repo)
        assert back.models["llm"].kv_cache_tokens == 2048 and back.models["slm"].server == SLM_AT
        assert differences(describe(config, config.model_names), describe(back, served_models(repo))) == []
    whole = render_repository(config, tmp_path / "one")  # the same config in one server: every model here
    assert served_models(whole) == ["slm", "llm"] and "one server running every model" in (
        whole / ".tokenrouter-repository").read_text()


@pytest.mark.parametrize("changes, named", [
    ({"models.llm.path": "/elsewhere/qwen-7b"}, 'models.llm.path: "large" here, "qwen-7b" there'),
    ({"scheduling.max_active": 16}, "scheduling.max_active: 8 here, 16 there"),
    ({"policy.params": {"rate": 0.5, "seed": 1}}, "policy.params"),
    ({"policy.name": "slm_only", "policy.params": {}}, 'policy.name: "random" here, "slm_only" there'),
    ({"models.llm.kv_cache_tokens": 4096}, "models.llm.kv_cache_tokens: 2048 here, 4096 there"),
    ({"models.llm.server": "node-3:8001"}, "models.llm.server"),
    ({"max_model_len": 256}, "max_model_len: null here, 256 there"),
])
def test_two_nodes_that_differ_are_told_which_value(tiny_pair, changes, named):
    here = load_config(split(tiny_pair))
    there = load_config(split(tiny_pair, **changes))
    found = differences(describe(here, ["slm"]), describe(there, ["llm"]))
    assert any(named in line for line in found), found


def test_what_a_node_chooses_alone_is_not_a_difference(tiny_pair):
    on_vllm = {"models.llm.engine": "vllm", "models.llm.block_size": 32}
    here = load_config(split(tiny_pair, **on_vllm))
    node_choices = {"models.llm.device": "auto", "models.llm.threads": 4, "models.llm.cpus": [1],
                    "models.llm.tensor_parallel_size": 2, "frontend.names": ["tokenrouter"],
                    "transport.delay_ms": 2.0, "chat_template": True}
    there = load_config(split(tiny_pair, **on_vllm, **node_choices))
    assert differences(describe(here, ["slm"]), describe(there, ["llm"])) == []


def test_another_tokenizer_is_a_difference_even_under_the_same_folder_name(tiny_pair, tmp_path):
    """The digest of tokenizer.json, not the folder's name: a node whose pair has another vocabulary."""
    other = tmp_path / "large"
    other.mkdir()
    for file in Path(tiny_pair["large"]).iterdir():
        (other / file.name).symlink_to(file)
    (other / "tokenizer.json").unlink()
    (other / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}}')
    here = load_config(split(tiny_pair, **{"models.slm.path": str(tiny_pair["small"])}))
    there = load_config(split(tiny_pair, **{"models.slm.path": "/not/on/this/node/small",
                                            "models.llm.path": str(other)}))
    assert [line.split(":")[0] for line in differences(describe(here, ["slm"]), describe(there, ["llm"]))] == [
        "tokenizer"]


def test_build_repository_renders_a_node_only_when_the_other_node_agrees(tiny_pair, tmp_path, capsys):
    """`build-repository --only llm --agree-with` refuses (exit 2, naming the value) when the other
    node's config or repository describes another deployment, and renders when it is the same."""
    import yaml

    from tokenrouter.launch.cli import main

    mine, same, other = tmp_path / "mine.yaml", tmp_path / "same.yaml", tmp_path / "other.yaml"
    mine.write_text(yaml.safe_dump(split(tiny_pair)))
    same.write_text(yaml.safe_dump(split(tiny_pair, **{"models.slm.cpus": [0]})))
    other.write_text(yaml.safe_dump(split(tiny_pair, **{"policy.params": {"rate": 0.9, "seed": 1}})))
    assert main(["build-repository", str(same), str(tmp_path / "slm"), "--only", "slm"]) == 0
    assert main(["build-repository", str(mine), str(tmp_path / "bad"), "--only", "llm",
                 "--agree-with", str(other)]) == 2
    disagreement = 'policy.params: {"rate": 0.3, "seed": 1} in this config, {"rate": 0.9, "seed": 1} in '
    assert disagreement in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
    for agreeing in (same, tmp_path / "slm"):
        assert main(["build-repository", str(mine), str(tmp_path / "llm"), "--only", "llm",
                     "--agree-with", str(agreeing)]) == 0
    assert served_models(tmp_path / "llm") == ["llm"]
