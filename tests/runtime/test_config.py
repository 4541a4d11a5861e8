"""The YAML config: every error names the field and what is allowed; relative paths resolve
against the config file; thresholds may depend on N."""

from __future__ import annotations

import pytest
import yaml

from config_changes import changed
from tokenrouter.config import ConfigError, TokenRouterConfig, load_config

BASE = {"models": {"slm": {"engine": "simulated", "profile": "tiny-cpu-small"},
                   "llm": {"engine": "simulated", "profile": "tiny-cpu-large"}}}


def _with(**changes):
    return changed(BASE, changes, sep="__")


@pytest.mark.parametrize("changes,field,allowed", [
    ({"models__llm__dtype": "fp8"}, "models.llm.dtype", "float32"),
    ({"models__llm__device": "tpu"}, "models.llm.device", "cuda:N"),
    ({"models__slm__engine": "sglang"}, "models.slm.engine", "vllm"),
    ({"models__slm__engine": "vllm", "models__slm__path": "m", "models__slm__block_size": 16}, "models.slm",
     "multiple of 32"),
    ({"models__slm__block_size": 0}, "models.slm.block_size", "greater than or equal to 1"),
    ({"models__slm__batch_threshold": 0}, "models.slm.batch_threshold", ">= 1"),
    ({"scheduling__strategy": "fastest"}, "scheduling.strategy", "tokenrouter"),
    ({"entry": "big"}, "entry", "slm, llm"),
    ({"models__llm__unknown_knob": 3}, "models.llm.unknown_knob", "Extra inputs"),
    ({"models__slm__engine": "torch"}, "models.slm", "needs 'path'"),
])
def test_errors_name_the_field(changes, field, allowed):
    with pytest.raises(ConfigError) as caught:
        load_config(_with(**changes))
    assert field in str(caught.value) and allowed in str(caught.value), str(caught.value)


def test_one_model_is_not_routing():
    with pytest.raises(ConfigError, match="at least 2 models"):
        load_config({"models": {"only": {"engine": "simulated", "profile": "x"}}})


def test_models_not_a_mapping_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match="models: Input should be a valid dictionary"):
        load_config({"models": [BASE["models"]["slm"], BASE["models"]["llm"]]})


@pytest.mark.parametrize("raw", [BASE, {**BASE, "entry": None}, TokenRouterConfig(**BASE).model_dump(mode="json")])
def test_an_entry_left_out_or_null_is_the_first_model(raw):
    assert load_config(raw).entry == "slm"


def test_refused_models_report_no_entry_error():
    """The entry defaults from the models: when they are refused, only they are named."""
    with pytest.raises(ConfigError) as caught:
        load_config({"models": ["slm", "llm"], "entry": None})
    assert "entry" not in str(caught.value) and "models: Input should be" in str(caught.value), str(caught.value)


def test_thresholds_by_active_count_and_entry_default():
    config = load_config(_with(models__llm__batch_threshold=[1, 2, 2, 3], scheduling__max_active=8))
    assert config.entry == "slm"
    assert [config.models["llm"].threshold_at(n) for n in (1, 2, 3, 4, 8)] == [1, 2, 2, 3, 3]


def test_auto_thresholds_skip_the_static_guard():
    config = load_config(_with(models__llm__batch_threshold="auto"))
    assert config.models["llm"].threshold_at(4) is None


def test_relative_paths_resolve_against_the_file(tmp_path):
    (tmp_path / "cfg").mkdir()
    path = tmp_path / "cfg" / "pair.yaml"
    path.write_text(yaml.safe_dump({"models": {"slm": {"path": "models/small"}, "llm": {"path": "/abs/large"}},
                                    "policy": {"name": "r2r", "weights": "router"}}))
    config = load_config(path)
    assert config.models["slm"].path == str(tmp_path / "cfg" / "models" / "small")
    assert config.models["llm"].path == "/abs/large"
    assert config.policy.weights == str(tmp_path / "cfg" / "router")


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "list.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(bad)
