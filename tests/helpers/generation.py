"""A parsed generation as flat fields, and what sets one apart from a baseline (the request-parsing tests)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from tokenrouter.serving.front.front_request import Generation


def fields(generation: Generation) -> dict[str, Any]:
    """A generation as flat fields: its own and its spec's (``spec.<name>``)."""
    flat = {name: value for name, value in asdict(generation).items() if name != "spec"}
    flat.update({f"spec.{name}": value for name, value in asdict(generation.spec).items()})
    return flat


def changes(generations: list[Generation], baseline: Generation) -> list[dict[str, Any]]:
    """Per generation, the fields that differ from the baseline's, with their values."""
    base = fields(baseline)
    return [{name: value for name, value in fields(g).items() if value != base[name]} for g in generations]
