"""Checked policy parameters: every policy declares a parameter model that refuses unknown names,
so a typo fails at config load naming the field instead of silently running the default."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenrouter.config import ConfigError, load_config
from tokenrouter.policies import PolicyError, registered_policies

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ["slm_only", "llm_only", "random", "r_stitch", "glimp", "query_level", "citer", "co_llm", "r2r", "ensemble"]


def _config(policy: str, params: dict) -> dict:
    return {"models": {"slm": {"engine": "simulated", "profile": "tiny-cpu-small"},
                       "llm": {"engine": "simulated", "profile": "tiny-cpu-large"}},
            "policy": {"name": policy, "params": params}}


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_policy_refuses_an_unknown_parameter(name):
    """Catches a policy whose parameters are read with defaults and never checked."""
    with pytest.raises(PolicyError, match=rf"policy '{name}': params\.no_such_knob: Extra inputs are not permitted"):
        registered_policies()[name].parse_params({"no_such_knob": 1})


def test_a_typo_fails_at_config_load_naming_the_field_and_the_allowed_ones():
    """The reported bug: ``threshhold: 0.07`` ran R-Stitch at its default threshold."""
    with pytest.raises(ConfigError) as caught:
        load_config(_config("r_stitch", {"threshhold": 0.07}))
    message = str(caught.value)
    assert "params.threshhold: Extra inputs are not permitted" in message
    assert "parameters: run_length, threshold" in message


@pytest.mark.parametrize("name, params, field", [
    ("glimp", {"threshold": "high"}, "params.threshold"),
    ("glimp", {"max_step_tokens": 0}, "params.max_step_tokens"),
    ("glimp", {"step_end_ids": "\n"}, "params.step_end_ids"),
    ("random", {"rate": 1.5}, "params.rate"),
    ("query_level", {"mode": "vibes"}, "params.mode"),
    ("ensemble", {"carry_top_k": 0}, "params.carry_top_k"),
])
def test_bad_values_name_the_field(name, params, field):
    with pytest.raises(ConfigError, match=rf"policy '{name}': {field}"):
        load_config(_config(name, params))


def test_every_shipped_config_passes_the_parameter_check():
    """Catches a shipped config whose policy parameters the check would now refuse."""
    configs = sorted((ROOT / "configs").glob("*.yaml"))
    assert configs
    for path in configs:
        raw = load_config(path)
        registered_policies()[raw.policy.name].parse_params(raw.policy.params)
