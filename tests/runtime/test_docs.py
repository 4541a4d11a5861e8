"""The docs stay true: the example config in docs/config.md loads, and the policy, strategy and
engine lists there and in docs/runtime.md name exactly what the code's one table of each holds."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tokenrouter.config import ENGINE_KINDS, STRATEGIES, load_config
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


def config_row(field: str) -> set[str]:
    """The backticked names in docs/config.md's reference row of ``field``, the field's own left out."""
    text = (DOCS / "config.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith(f"| `{field}` |"))
    return set(re.findall(r"`(\w+)`", row)) - {field}


def test_config_reference_lists_the_strategies_and_engines():
    assert config_row("strategy") == set(STRATEGIES)
    assert config_row("engine") == set(ENGINE_KINDS)


def test_runtime_docs_list_the_strategies():
    text = (DOCS / "runtime.md").read_text()
    table = text.split("## Strategies (for comparison)", 1)[1].split("\n\n", 2)[1]
    assert re.findall(r"^\| `(\w+)` \|", table, re.M) == list(STRATEGIES)


def test_every_scheduling_rule_names_tests_that_exist():
    """docs/runtime.md lists each scheduling rule with the tests that hold it; a renamed or
    deleted test must not leave the table pointing at nothing."""
    text = (DOCS / "runtime.md").read_text()
    table = text.split("## Scheduling rules and the tests that hold them", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`(?:[\w.]+::)?(test_\w+)`", table))
    files = set(re.findall(r"`(test_\w+)\.py", table))
    here = Path(__file__).parent
    defined = set(re.findall(r"^def (test_\w+)", "\n".join(p.read_text() for p in here.glob("test_*.py")), re.M))
    assert len(named) > 20 and named <= defined, sorted(named - defined)
    assert files and all((here / f"{name}.py").is_file() for name in files), files
