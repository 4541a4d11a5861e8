"""The simulated engine's token source: next-token logits and a hidden state as a pure function
of (model seed, the last ``window`` context tokens, the context length).

Per position, hashed randomness decides:
- eos (rate ``eos_rate``): a confident end-of-sequence;
- hard (rate ``hard_rate``): a small margin (0-6 nats) for a model-specific token: normalized
  entropy mostly 0.25-0.9, and models disagree here;
- otherwise easy: a large margin (14-20 nats, normalized entropy below ~0.02) for a token chosen
  by ``world_seed``, so models that share it agree on easy positions.
The eos logit is pushed down elsewhere, so greedy runs end only where eos was decided. Component 0
of the hidden state is margin / 10 - 1 (-1..-0.4 on hard positions, 0.4..1 on easy ones): a
signal that learned routers (CITER, R2R) can pick up; the other components are noise.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Sequence

import numpy as np

from .sim_profile import SimProfile

_HARD_MARGIN = (0.0, 6.0)
_EASY_MARGIN = (14.0, 20.0)
_EOS_PENALTY = 6.0


def _key(*parts: int, tokens: Sequence[int] = ()) -> int:
    data = struct.pack(f"<{len(parts) + len(tokens)}q", *parts, *tokens)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


class TokenSource:
    """Deterministic signals of one simulated model."""

    def __init__(self, profile: SimProfile, seed: int) -> None:
        self.profile = profile
        self.seed = seed & 0x7FFF_FFFF_FFFF_FFFF

    def signals(self, tail: Sequence[int], length: int, *, hidden: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """(logits [V] float32, hidden [H] float32 or None) after a context of ``length`` tokens
        ending in ``tail`` (its last ``window`` tokens)."""
        profile = self.profile
        tail = tuple(tail[-profile.window:])
        rng = np.random.default_rng(_key(self.seed, length, tokens=tail))
        u_eos, u_hard, u_margin, u_token = rng.random(4)
        vocab = profile.vocab_size
        eos = profile.eos_id
        if u_eos < profile.eos_rate:
            top, margin = eos, _EASY_MARGIN[0] + (_EASY_MARGIN[1] - _EASY_MARGIN[0]) * u_margin
        elif u_hard < profile.hard_rate:
            top = self._not_eos(int(u_token * (vocab - 1)))
            margin = _HARD_MARGIN[0] + (_HARD_MARGIN[1] - _HARD_MARGIN[0]) * u_margin
        else:
            top = self._not_eos(_key(profile.world_seed, length, tokens=tail) % (vocab - 1))
            margin = _EASY_MARGIN[0] + (_EASY_MARGIN[1] - _EASY_MARGIN[0]) * u_margin
        logits = rng.standard_normal(vocab)
        if top != eos:
            logits[eos] -= _EOS_PENALTY
        logits[top] += margin
        state = None
        if hidden:
            state = rng.standard_normal(profile.hidden_size)
            state[0] = margin / 10.0 - 1.0
            state = state.astype(np.float32)
        return logits.astype(np.float32), state

    def _not_eos(self, token: int) -> int:
        """Map [0, vocab - 1) onto the vocabulary without the eos id."""
        return token + 1 if token >= self.profile.eos_id else token
