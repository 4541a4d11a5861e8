"""Profiles of the simulated engine: step latency and the shape of its token source.

A profile is a name from ``PROFILES`` or a dict with any of these keys (the rest default):

    base           a named profile to start from (the other keys override it)
    base_ms        fixed cost of one step (ms)
    per_row_ms     added per sequence in the batch (ms)
    per_token_ms   added per prefill/extend token beyond each row's first (ms)
    time_scale     multiplies every sleep; 0 runs as fast as the CPU allows (latency still recorded)
    vocab_size     size of the output vocabulary (token ids the engine produces)
    hidden_size    length of the hidden-state vector
    max_model_len  longest sequence (tokens)
    seed           identity of the model's token source; None: derived from the engine's name
    world_seed     shared by models meant to agree on easy positions
    hard_rate      fraction of positions with a flat (high-entropy) next-token distribution
    eos_rate       fraction of positions whose confident token is end-of-sequence
    eos_token_id   the eos id; None: vocab_size - 1
    window         how many trailing context tokens the logits depend on (besides the position)

Step latency = base_ms + per_row_ms * rows + per_token_ms * (new tokens - rows).

The two "a100-r2r-*" profiles reproduce the step latencies the TokenRouter paper measured for
Qwen3-0.6B and Qwen3-32B (TP2) on A100 at small batch: 6.0 ms and 27.9 ms with one row. The
batch-size slope (0.1 and 0.4 ms per row) and the prefill cost per token are our assumptions,
mild on purpose: small-batch decoding is memory-bound. hard_rate 0.35 on the small model matches
the paper's example routing probability p = 0.35 for entropy-threshold policies.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields, replace
from typing import Any


@dataclass(frozen=True)
class SimProfile:
    base_ms: float = 1.0
    per_row_ms: float = 0.0
    per_token_ms: float = 0.0
    time_scale: float = 1.0
    vocab_size: int = 512
    hidden_size: int = 64
    max_model_len: int = 32768
    seed: int | None = None
    world_seed: int = 0
    hard_rate: float = 0.2
    eos_rate: float = 0.001
    eos_token_id: int | None = None
    window: int = 4

    def __post_init__(self) -> None:
        problems = []
        if min(self.base_ms, self.per_row_ms, self.per_token_ms, self.time_scale) < 0:
            problems.append("latency terms and time_scale must be >= 0")
        if self.vocab_size < 2 or self.hidden_size < 1 or self.max_model_len < 2 or self.window < 1:
            problems.append("need vocab_size >= 2, hidden_size >= 1, max_model_len >= 2, window >= 1")
        if not (0 <= self.hard_rate <= 1 and 0 <= self.eos_rate <= 1):
            problems.append("hard_rate and eos_rate must lie in [0, 1]")
        if self.eos_token_id is not None and not 0 <= self.eos_token_id < self.vocab_size:
            problems.append(f"eos_token_id must lie in [0, vocab_size), got {self.eos_token_id}")
        if problems:
            raise ValueError("simulated profile: " + "; ".join(problems))

    @property
    def eos_id(self) -> int:
        return self.vocab_size - 1 if self.eos_token_id is None else self.eos_token_id

    def step_ms(self, rows: int, new_tokens: int) -> float:
        """Profiled latency of a step over ``rows`` sequences appending ``new_tokens`` in total."""
        return self.base_ms + self.per_row_ms * rows + self.per_token_ms * max(0, new_tokens - rows)

    def seed_for(self, name: str) -> int:
        if self.seed is not None:
            return self.seed
        return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


PROFILES: dict[str, SimProfile] = {
    "a100-r2r-0.6b": SimProfile(base_ms=5.9, per_row_ms=0.1, per_token_ms=0.01, hidden_size=1024,
                                seed=600, hard_rate=0.35),
    "a100-r2r-32b": SimProfile(base_ms=27.5, per_row_ms=0.4, per_token_ms=0.05, hidden_size=5120,
                               seed=32000, hard_rate=0.05),
    "tiny-cpu-small": SimProfile(base_ms=0.2, per_row_ms=0.02, per_token_ms=0.002, hidden_size=32,
                                 max_model_len=4096, seed=1, hard_rate=0.3),
    "tiny-cpu-large": SimProfile(base_ms=0.8, per_row_ms=0.05, per_token_ms=0.005, hidden_size=48,
                                 max_model_len=4096, seed=2, hard_rate=0.05),
}


def resolve_profile(profile: str | dict[str, Any] | SimProfile) -> SimProfile:
    """A named profile, a dict of overrides (``{"base": name}`` starts from a named one), or as is."""
    if isinstance(profile, SimProfile):
        return profile
    if isinstance(profile, str):
        if profile not in PROFILES:
            raise ValueError(f"unknown simulated profile '{profile}'; named ones: {', '.join(PROFILES)}")
        return PROFILES[profile]
    if not isinstance(profile, dict):
        raise ValueError(f"a simulated profile is a name or a dict, got {type(profile).__name__}")
    overrides = dict(profile)
    base = resolve_profile(overrides.pop("base")) if "base" in overrides else SimProfile()
    unknown = sorted(set(overrides) - set(_KINDS))
    if unknown:
        raise ValueError(f"simulated profile: unknown keys {unknown}; allowed: base, {', '.join(_KINDS)}")
    values: dict[str, Any] = {}  # each field's own kind (_KINDS), checked below
    for key, value in overrides.items():
        try:  # YAML may hand over strings or ints where floats are meant
            values[key] = None if value is None and key in _OPTIONAL else _KINDS[key](value)
        except (TypeError, ValueError):
            raise ValueError(f"simulated profile: '{key}' must be {_KINDS[key].__name__}, got {value!r}") from None
    return replace(base, **values)


_OPTIONAL = ("seed", "eos_token_id")
_KINDS: dict[str, type] = {f.name: int if f.name in _OPTIONAL or isinstance(f.default, int) else float
                           for f in fields(SimProfile)}
