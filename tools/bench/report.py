"""Report writers: raw JSON for results/, markdown tables for the terminal and docs/."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any, Sequence

import torch


def machine() -> dict[str, Any]:
    """What the numbers were measured on (benchmarks on a shared machine need this next to them)."""
    return {"cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
            "time": time.strftime("%Y-%m-%d %H:%M:%S")}


def write_json(path: Path, payload: dict[str, Any]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine(), **payload}, indent=1, default=str))
    return path


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
    lines += ["| " + " | ".join(fmt(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def pct(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * fraction:.1f} %"


def verdict(value: float, target: float) -> str:
    return "met" if value >= target else "not met"
