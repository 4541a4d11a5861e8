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

The noise is not drawn per position: each model draws NOISE_ROWS Gaussian rows once, and a
position's hash picks a row and a rotation of it. A fresh ``standard_normal(vocab)`` per row of
every step was most of the simulated engines' CPU (and so of the "server CPU" the served benchmark
charges them, which on a GPU would be model work); a rotated slice is one copy.
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


_TO_UNIT = 2.0 ** -53


def _words(count: int, *parts: int, tokens: Sequence[int] = ()) -> tuple[int, ...]:
    """``count`` 64-bit words hashed from the integers ``parts`` and ``tokens``."""
    data = struct.pack(f"<{len(parts) + len(tokens)}q", *parts, *tokens)
    return struct.unpack(f"<{count}Q", hashlib.blake2b(data, digest_size=8 * count).digest())


def _key(*parts: int, tokens: Sequence[int] = ()) -> int:
    return _words(1, *parts, tokens=tokens)[0]


def _uniforms(*parts: int, tokens: Sequence[int] = ()) -> tuple[float, float, float, float, int, int]:
    """Six independent draws from one hash: four uniforms in [0, 1), then two raw 64-bit words."""
    words = _words(6, *parts, tokens=tokens)
    u = [(w >> 11) * _TO_UNIT for w in words[:4]]
    return u[0], u[1], u[2], u[3], words[4], words[5]


NOISE_ROWS = 16


class _Noise:
    """NOISE_ROWS Gaussian rows of one length, each stored twice over so that any rotation is one slice."""

    def __init__(self, rng: np.random.Generator, length: int) -> None:
        rows = rng.standard_normal((NOISE_ROWS, length)).astype(np.float32)
        self._doubled = np.concatenate([rows, rows], axis=1)
        self._length = length

    def draw(self, row_word: int, shift_word: int) -> np.ndarray:
        shift = shift_word % self._length
        return self._doubled[row_word % NOISE_ROWS, shift:shift + self._length].copy()


class TokenSource:
    """Deterministic signals of one simulated model."""

    def __init__(self, profile: SimProfile, seed: int) -> None:
        self.profile = profile
        self.seed = seed & 0x7FFF_FFFF_FFFF_FFFF
        rng = np.random.default_rng(self.seed)
        self._logit_noise = _Noise(rng, profile.vocab_size)
        self._hidden_noise = _Noise(rng, profile.hidden_size)

    def signals(self, tail: Sequence[int], length: int, *, hidden: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """(logits [V] float32, hidden [H] float32 or None) after a context of ``length`` tokens
        ending in ``tail`` (its last ``window`` tokens)."""
        profile = self.profile
        tail = tuple(tail[-profile.window:])
        u_eos, u_hard, u_margin, u_token, row_word, shift_word = _uniforms(self.seed, length, tokens=tail)
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
        logits = self._logit_noise.draw(row_word, shift_word)
        if top != eos:
            logits[eos] -= _EOS_PENALTY
        logits[top] += margin
        state = None
        if hidden:
            state = self._hidden_noise.draw(shift_word, row_word)
            state[0] = margin / 10.0 - 1.0
        return logits, state

    def _not_eos(self, token: int) -> int:
        """Map [0, vocab - 1) onto the vocabulary without the eos id."""
        return token + 1 if token >= self.profile.eos_id else token
