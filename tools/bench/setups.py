"""The model pairs a benchmark runs on, each with its routing rate and workload sizes.

  sim    the simulated engine with the paper's A100 step latencies (Qwen3-0.6B / 32B TP2)
  tiny   the tiny random qwen3 pair on CPU (plumbing speed, not quality)
  real   Qwen2.5-Coder 0.5B / 1.5B Instruct on CPU (a few tokens/s: short runs, small outputs)

Routing on every pair is the ``random`` policy: a position goes to the large model with
probability ``rate`` (the small model's token there is dropped), and the large model hands back
after one token, like the paper's R2R example. The Markov model's inputs are then known exactly:
P = [[1 - rate, rate], [1, 0]], C = [[1, 0], [1, 0]].
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from tokenrouter.config import ModelSpec
from tokenrouter.engine.base import Engine
from tokenrouter.engine.factory import create_engine
from tokenrouter.engine.sim_profile import resolve_profile
from tokenrouter.text import TextCodec

from .workloads import PromptSource, TextPrompts, TokenPrompts, Workload

SMALL, LARGE = "slm", "llm"
PAIR_SETUPS = ("sim", "tiny", "real")


@dataclass
class Setup:
    kind: str
    models: dict[str, dict[str, Any]]  # ModelSpec fields for SMALL and LARGE (thresholds set per system)
    rate: float
    workloads: dict[str, Workload]
    max_wait_ms: float  # the scheduler's starvation guard: well above the slowest step
    max_model_len: int
    tokenizer: str | None = None  # None: token-id prompts (the simulated engine)
    notes: list[str] = field(default_factory=list)

    def source(self) -> PromptSource:
        if self.tokenizer:
            return TextPrompts()
        profile = resolve_profile(self.models[SMALL]["profile"])
        return TokenPrompts(profile.vocab_size, profile.eos_id)

    def codec(self) -> TextCodec | None:
        return TextCodec.from_path(self.tokenizer) if self.tokenizer else None

    def open_engines(self) -> dict[str, Engine]:
        """One engine per model, shared by every system of a run (loading real weights is slow)."""
        return {name: create_engine(name, ModelSpec(**spec)) for name, spec in self.models.items()}

    def with_workload(self, kind: str, max_tokens: int | None) -> Workload:
        workload = self.workloads[kind]
        return replace(workload, max_tokens=max_tokens) if max_tokens else workload

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "models": copy.deepcopy(self.models), "rate": self.rate,
                "max_wait_ms": self.max_wait_ms, "max_model_len": self.max_model_len, "notes": self.notes}


def sim_setup(rate: float = 0.35, *, prefill_cost: bool = True, eos: bool = True, time_scale: float = 1.0) -> Setup:
    """``prefill_cost=False`` zeroes the per-token prefill/extend cost, so a step costs exactly the
    batch-size latency; ``eos=False`` lets every request run to its token cap (the model validation
    uses both: the throughput model's inputs are then the system's)."""
    def model(profile: str) -> dict[str, Any]:
        overrides: dict[str, Any] = {"base": profile, "time_scale": time_scale}
        if not prefill_cost:
            overrides["per_token_ms"] = 0.0
        if not eos:
            overrides["eos_rate"] = 0.0
        # a large pool: the simulated KV is accounting only, and std-serving's cache may fill it
        return {"engine": "simulated", "profile": overrides, "kv_cache_tokens": 1 << 19, "max_batch_size": 32,
                "max_prefill_tokens": 8192}

    return Setup(
        kind="sim", models={SMALL: model("a100-r2r-0.6b"), LARGE: model("a100-r2r-32b")}, rate=rate,
        workloads={
            "short-long": Workload("short-long", (16, 64), 256),
            "long-short": Workload("long-short", (1024, 2048), 32),
            "multi-turn": Workload("multi-turn", (32, 96), 64, turns=4),
        },
        max_wait_ms=200.0 * time_scale, max_model_len=32768,  # the guard on the simulated clock
        notes=["simulated engine: paper A100 step latencies (6.0 / 27.9 ms at batch 1) by sleeping"],
    )


def _pair_models(pair: dict[str, Path], *, kv_cache_tokens: int, threads: int | None) -> dict[str, dict[str, Any]]:
    """Model specs for a built pair: the small model serves as SMALL, the large one as LARGE."""
    return {name: {"path": str(pair[size]), "kv_cache_tokens": kv_cache_tokens, "max_batch_size": 16,
                   "threads": threads}
            for name, size in ((SMALL, "small"), (LARGE, "large"))}


def tiny_setup(rate: float = 0.3, threads: int | None = 1) -> Setup:
    """The pair and settings of configs/tiny.yaml (what `tokenrouter serve --tiny` serves)."""
    from tokenrouter_engines.tiny import ensure_tiny_pair

    pair = ensure_tiny_pair("qwen3", 0)
    models = _pair_models(pair, kv_cache_tokens=8192, threads=threads)
    return Setup(
        kind="tiny", models=models, rate=rate,
        workloads={
            "short-long": Workload("short-long", (16, 48), 128, max_context=1024),
            "long-short": Workload("long-short", (300, 400), 16, max_context=1024),
            "multi-turn": Workload("multi-turn", (16, 48), 48, turns=3, max_context=1024),
        },
        max_wait_ms=20.0, max_model_len=1024, tokenizer=str(pair["small"]),
        notes=["tiny random qwen3 pair (engines/tiny.py) on CPU", f"torch threads per engine: {threads}"],
    )


def real_setup(rate: float = 0.1, threads: int | None = 2) -> Setup:
    from tokenrouter_engines.models import ensure_real_pair

    pair = ensure_real_pair(progress=True)
    models = _pair_models(pair, kv_cache_tokens=4096, threads=threads)
    return Setup(
        kind="real", models=models, rate=rate,
        workloads={
            "short-long": Workload("short-long", (16, 48), 24, max_context=2048),
            "long-short": Workload("long-short", (200, 300), 8, max_context=2048),
            "multi-turn": Workload("multi-turn", (16, 32), 16, turns=3, max_context=2048),
        },
        max_wait_ms=3000.0, max_model_len=2048, tokenizer=str(pair["small"]),
        notes=["Qwen2.5-Coder 0.5B / 1.5B Instruct, float32 on CPU, no chat template",
               f"torch threads per engine: {threads}"],
    )


def make_setup(kind: str, *, rate: float | None = None, threads: int | None = None) -> Setup:
    """The pair setup ``kind``; ``rate`` and ``threads`` override its own defaults where given."""
    if kind == "sim":
        return sim_setup() if rate is None else sim_setup(rate)
    if kind not in ("tiny", "real"):
        raise ValueError(f"unknown pair setup '{kind}'; allowed: {', '.join(PAIR_SETUPS)}")
    setup = partial(tiny_setup if kind == "tiny" else real_setup)
    if rate is not None:
        setup = partial(setup, rate=rate)
    if threads is not None:
        setup = partial(setup, threads=threads)
    return setup()
