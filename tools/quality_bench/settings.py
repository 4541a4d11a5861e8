"""Which policies the benchmark runs and with what parameters.

A setting is written ``name`` (the benchmark's preset parameters for that policy) or
``name:key=value:key=value`` (the preset updated with these; values are YAML, so ``[198, 271]``
is a list). The written form is the setting's label in results, so two thresholds of one
policy are two rows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tokenrouter.config import TokenRouterConfig, load_config

# Policies whose network comes from a trained router directory (train-router's <out>/<algo>/).
LEARNED = ("r2r", "citer", "co_llm")
NEWLINE_IDS = [198, 271]  # Qwen2.5's "\n" and "\n\n": a GlimpRouter step is a line of code

# Preset parameters per policy: thresholds picked from router scores and entropies of SLM-only
# outputs on HumanEval problems outside the benchmark sample, aiming at about 20-25 % of tokens
# (query_level: of requests) for the large model (docs/quality.md). The learned routers without a
# threshold use the one training picked (R2R's already defers only ~16 % of HumanEval tokens).
PRESETS: dict[str, dict[str, Any]] = {
    "slm_only": {},
    "llm_only": {},
    "random": {"rate": 0.2, "seed": 0},
    "r_stitch": {"threshold": 0.05},
    "glimp": {"threshold": 0.01, "step_end_ids": NEWLINE_IDS},
    "citer": {"threshold": 0.1},
    "r2r": {},
    "co_llm": {"threshold": 0.72},
    "ensemble": {"weights": [0.5, 0.5]},
    "query_level": {"mode": "entropy", "threshold": 0.008},
}
# Items of a --policies list are separated by commas outside brackets (a list value has commas).
ITEM_SEPARATOR = re.compile(r",(?![^\[]*\])")


@dataclass(frozen=True)
class PolicySetting:
    label: str
    name: str
    params: dict[str, Any] = field(default_factory=dict)

    def weights_dir(self, routers: Path) -> Path | None:
        """The trained router this setting needs, if any."""
        if self.name in LEARNED:
            return routers / self.name
        if self.name == "query_level" and self.params.get("mode") == "classifier":
            return routers / str(self.params.get("classifier", "citer"))
        return None

    def config(self, base: TokenRouterConfig, *, chat_template: bool, routers: Path) -> TokenRouterConfig:
        """``base`` with this policy and the prompt format (validated like any config)."""
        weights = self.weights_dir(routers)
        policy = {"name": self.name, "params": self.params, "weights": str(weights) if weights else None}
        return load_config({**base.model_dump(), "policy": policy, "chat_template": chat_template})


def parse_setting(text: str) -> PolicySetting:
    name, *assignments = text.strip().split(":")
    if name not in PRESETS:
        raise ValueError(f"unknown policy '{name}' in '{text}'; allowed: {', '.join(PRESETS)}")
    params = dict(PRESETS[name])
    for assignment in assignments:
        key, sep, value = assignment.partition("=")
        if not sep or not key:
            raise ValueError(f"'{assignment}' in '{text}' is not key=value")
        params[key.strip()] = yaml.safe_load(value)
    return PolicySetting(text.strip(), name, params)


def parse_settings(text: str) -> list[PolicySetting]:
    """A comma-separated list of settings, in order; a repeated label is an error."""
    settings = [parse_setting(item) for item in ITEM_SEPARATOR.split(text) if item.strip()]
    labels = [s.label for s in settings]
    if len(set(labels)) != len(labels):
        raise ValueError(f"a policy setting is listed twice in '{text}'")
    return settings
