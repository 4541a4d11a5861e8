"""The docs stay true: the example config in docs/config.md loads, and the policy list there
names every registered policy."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tokenrouter.config import load_config
from tokenrouter.policies import registered_policies

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_config_reference_example_is_valid():
    text = (DOCS / "config.md").read_text()
    example = re.search(r"## A complete example\n\n```yaml\n(.*?)```", text, re.S).group(1)
    config = load_config(yaml.safe_load(example))
    assert config.model_names == ["slm", "llm"]
    assert [config.models["llm"].threshold_at(n) for n in (1, 2, 4, 8)] == [1, 2, 3, 3]


def test_config_reference_lists_every_policy():
    text = (DOCS / "config.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `name` | `slm_only`"))
    documented = set(re.findall(r"`(\w+)`", row)) - {"name"}
    shipped = {name for name, cls in registered_policies().items() if cls.__module__.startswith("tokenrouter.")}
    assert documented == shipped  # tests register policies of their own; those are not shipped
