"""Test configs as a base dict plus changes named by their key path."""

from __future__ import annotations

import copy
from typing import Any


def changed(config: dict[str, Any], changes: dict[str, Any], sep: str = ".") -> dict[str, Any]:
    """A deep copy of ``config`` with each change set at its path (``"models.llm.threshold"``),
    creating the dicts on the way."""
    result = copy.deepcopy(config)
    for path, value in changes.items():
        *parents, last = path.split(sep)
        node = result
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return result
