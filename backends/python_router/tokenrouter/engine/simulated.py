"""A simulated engine: profiled step latencies and a deterministic token source, no model.

It runs the scheduler at A100 scale on a laptop. Each step sleeps for the profiled latency
(``time.sleep`` releases the GIL, so two simulated models on two threads overlap like two GPUs),
and its logits depend only on the model's seed, the last few context tokens and the context
length, so ``reference_logits`` on the full token list reproduces every step exactly. KV block
accounting is the real one (``BlockPool``); only the last ``window`` tokens of each sequence are
kept, which is all the token source reads.

Token ids live in [0, vocab_size) both ways, as on a real engine (the runtime checks prompts
against the entry engine's vocabulary, so simulated pairs run on token ids, not text).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch

from .base import SeqId, StepResult, StepRow
from .pooled import PooledEngine, sampled_result
from .sim_profile import SimProfile, resolve_profile
from .sim_tokens import TokenSource
from .threads import IntraOpThreads

if TYPE_CHECKING:
    from ..config import ModelSpec


class SimulatedEngine(PooledEngine):
    def __init__(self, name: str, profile: str | dict[str, Any] | SimProfile, *, block_size: int = 16,
                 kv_cache_tokens: int = 16384, threads: int | None = None) -> None:
        """``threads``: torch intra-op threads for sampling (None: torch's default; 1 keeps idle
        OpenMP workers from spinning on cores the serving path needs)."""
        self.name = name
        self.profile = resolve_profile(profile)
        self._source = TokenSource(self.profile, self.profile.seed_for(name))
        super().__init__(max(1, kv_cache_tokens // block_size), block_size)
        self._tails: dict[SeqId, tuple[int, ...]] = {}
        self.last_latency_s = 0.0  # profiled latency of the last step (before time_scale)
        self.total_latency_s = 0.0  # sum over all steps: the simulated busy time
        self.num_steps = 0
        self._intra_op = IntraOpThreads(threads)

    @classmethod
    def from_spec(cls, name: str, spec: "ModelSpec") -> "SimulatedEngine":
        if spec.profile is None:
            raise ValueError(f"model '{name}': engine 'simulated' needs 'profile' (a profile name or a dict)")
        return cls(name, spec.profile, block_size=spec.block_size, kv_cache_tokens=spec.kv_cache_tokens,
                   threads=spec.threads)

    # --- shape facts ------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.profile.vocab_size

    @property
    def hidden_size(self) -> int:
        return self.profile.hidden_size

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return frozenset({self.profile.eos_id})

    @property
    def max_model_len(self) -> int:
        return self.profile.max_model_len

    # --- sequences: the pool's bookkeeping plus each sequence's token tail ------------------------
    def add_sequence(self, seq_id: SeqId) -> None:
        super().add_sequence(seq_id)
        self._tails[seq_id] = ()

    def release(self, seq_id: SeqId) -> bool:
        self._tails.pop(seq_id, None)
        return super().release(seq_id)

    # --- the step ---------------------------------------------------------------------------------
    def step(self, rows: Sequence[StepRow], *, return_hidden: bool = False, top_logits: int = 0,
             return_logits: bool = True) -> StepResult:
        started = time.perf_counter()
        self._intra_op.apply()
        tokens = self.check_rows(rows, top_logits)
        self._pool.append({row.seq_id: len(new) for row, new in zip(rows, tokens)})  # all or nothing
        logits, hidden, positions = [], [], []  # hidden: filled only with return_hidden
        for row, new in zip(rows, tokens):
            tail = (self._tails[row.seq_id] + new)[-self.profile.window:]
            self._tails[row.seq_id] = tail
            length = self._pool.length(row.seq_id)
            row_logits, row_hidden = self._source.signals(tail, length, hidden=return_hidden)
            logits.append(row_logits)
            if row_hidden is not None:
                hidden.append(row_hidden)
            positions.append(length)
        result = sampled_result(rows, torch.from_numpy(np.stack(logits)), positions, top_logits,
                                torch.from_numpy(np.stack(hidden)) if return_hidden else None,
                                counts=self._context_counts, return_logits=return_logits)
        self._wait(started, self.profile.step_ms(len(rows), sum(map(len, tokens))) / 1e3)
        return result

    def reference_logits(self, tokens: Sequence[int]) -> torch.Tensor:
        """Next-token logits [V] after the full context ``tokens``: what a step ending there returns."""
        return torch.from_numpy(self._source.signals(list(tokens), len(tokens), hidden=False)[0])

    def reference(self, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [V], hidden [H]) after the full context: a ``runtime.reference.FullRecompute``."""
        logits, hidden = self._source.signals(list(tokens), len(tokens), hidden=True)
        return torch.from_numpy(logits), torch.from_numpy(hidden)

    def _wait(self, started: float, latency_s: float) -> None:
        """Sleep out the rest of the profiled latency (the token source's own time counts)."""
        self.last_latency_s = latency_s
        self.total_latency_s += latency_s
        self.num_steps += 1
        remaining = started + latency_s * self.profile.time_scale - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)
