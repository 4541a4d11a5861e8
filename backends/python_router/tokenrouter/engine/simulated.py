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

import operator
import time
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch

from .base import Engine, SeqId, StepResult, StepRow, UnknownSequence
from .kv_pool import BlockPool
from .sampling import sample_tokens
from .sim_profile import SimProfile, resolve_profile
from .sim_tokens import TokenSource

if TYPE_CHECKING:
    from ..config import ModelSpec


class SimulatedEngine(Engine):
    def __init__(self, name: str, profile: str | dict[str, Any] | SimProfile, *, block_size: int = 16,
                 kv_cache_tokens: int = 16384) -> None:
        self.name = name
        self.profile = resolve_profile(profile)
        self._source = TokenSource(self.profile, self.profile.seed_for(name))
        self._pool = BlockPool(max(1, kv_cache_tokens // block_size), block_size)
        self._tails: dict[SeqId, tuple[int, ...]] = {}
        self.last_latency_s = 0.0  # profiled latency of the last step (before time_scale)
        self.total_latency_s = 0.0  # sum over all steps: the simulated busy time
        self.num_steps = 0

    @classmethod
    def from_spec(cls, name: str, spec: "ModelSpec") -> "SimulatedEngine":
        return cls(name, spec.profile, block_size=spec.block_size, kv_cache_tokens=spec.kv_cache_tokens)

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

    # --- KV pool ----------------------------------------------------------------------------------
    @property
    def block_size(self) -> int:
        return self._pool.block_size

    @property
    def num_total_blocks(self) -> int:
        return self._pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self._pool.num_free

    # --- sequences --------------------------------------------------------------------------------
    def add_sequence(self, seq_id: SeqId) -> None:
        self._pool.add(seq_id)
        self._tails[seq_id] = ()

    def has_sequence(self, seq_id: SeqId) -> bool:
        return seq_id in self._pool

    def num_cached(self, seq_id: SeqId) -> int:
        return self._pool.length(seq_id)

    def sequence_ids(self) -> list[SeqId]:
        return self._pool.sequence_ids()

    def release(self, seq_id: SeqId) -> bool:
        self._tails.pop(seq_id, None)
        return self._pool.free(seq_id)

    # --- the step ---------------------------------------------------------------------------------
    def step(self, rows: Sequence[StepRow], *, return_hidden: bool = False, top_logits: int = 0) -> StepResult:
        started = time.perf_counter()
        tokens = self._validate(rows, top_logits)
        self._pool.append({row.seq_id: len(new) for row, new in zip(rows, tokens)})  # all or nothing
        logits, hidden, positions = [], [], []
        for row, new in zip(rows, tokens):
            tail = (self._tails[row.seq_id] + new)[-self.profile.window:]
            self._tails[row.seq_id] = tail
            length = self._pool.length(row.seq_id)
            row_logits, row_hidden = self._source.signals(tail, length, hidden=return_hidden)
            logits.append(row_logits)
            hidden.append(row_hidden)
            positions.append(length)
        logits_t = torch.from_numpy(np.stack(logits))
        result = StepResult(
            seq_ids=[row.seq_id for row in rows],
            sampled=sample_tokens(logits_t, [row.sampling for row in rows], positions),
            logits=logits_t,
            positions=torch.tensor(positions, dtype=torch.int64),
            hidden=torch.from_numpy(np.stack(hidden)) if return_hidden else None,
        )
        if top_logits:
            result.topk_values, result.topk_indices = torch.topk(logits_t, top_logits, dim=-1)
        self._wait(started, self.profile.step_ms(len(rows), sum(map(len, tokens))) / 1e3)
        return result

    def reference_logits(self, tokens: Sequence[int]) -> torch.Tensor:
        """Next-token logits [V] after the full context ``tokens``: what a step ending there returns."""
        return torch.from_numpy(self._source.signals(list(tokens), len(tokens), hidden=False)[0])

    def reference(self, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [V], hidden [H]) after the full context: a ``runtime.reference.FullRecompute``."""
        logits, hidden = self._source.signals(list(tokens), len(tokens), hidden=True)
        return torch.from_numpy(logits), torch.from_numpy(hidden)

    def _validate(self, rows: Sequence[StepRow], top_logits: int) -> list[tuple[int, ...]]:
        """Every check before any state changes; returns each row's new tokens as ints."""
        if not rows:
            raise ValueError("a step needs at least one row")
        if not 0 <= top_logits <= self.vocab_size:
            raise ValueError(f"top_logits must lie in [0, {self.vocab_size}], got {top_logits}")
        seen: set[SeqId] = set()
        out = []
        for row in rows:
            if row.seq_id not in self._pool:
                raise UnknownSequence(row.seq_id)
            if row.seq_id in seen:
                raise ValueError(f"sequence {row.seq_id!r} appears twice in one step")
            seen.add(row.seq_id)
            try:
                new = tuple(operator.index(t) for t in row.new_tokens)
            except TypeError:
                raise ValueError(f"sequence {row.seq_id!r}: token ids must be integers") from None
            if not new:
                raise ValueError(f"sequence {row.seq_id!r}: a row needs at least one new token")
            if min(new) < 0 or max(new) >= self.vocab_size:
                raise ValueError(f"sequence {row.seq_id!r}: token ids must lie in [0, {self.vocab_size}), "
                                 f"got {min(new)}..{max(new)}")
            total = self._pool.length(row.seq_id) + len(new)
            if total > self.max_model_len:
                raise ValueError(f"sequence {row.seq_id!r}: {total} tokens exceed max_model_len {self.max_model_len}")
            out.append(new)
        return out

    def _wait(self, started: float, latency_s: float) -> None:
        """Sleep out the rest of the profiled latency (the token source's own time counts)."""
        self.last_latency_s = latency_s
        self.total_latency_s += latency_s
        self.num_steps += 1
        remaining = started + latency_s * self.profile.time_scale - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)
