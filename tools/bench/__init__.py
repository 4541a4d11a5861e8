"""The benchmark suite behind `tokenrouter bench` (see docs/benchmarks.md)."""

from .cli import configure, run

__all__ = ["configure", "run"]
