"""Per-request output constraints applied to a step's result before routing: bad words.

A bad word is a token sequence the output must never contain. Its last token is banned whenever
the context ends with the rest of it (a one-token bad word is always banned). Rows whose sampled
token is banned are resampled from the masked logits with the same per-(seed, position) draw,
so a row whose token was allowed keeps it: the result equals sampling the masked distribution.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..engine.base import StepResult
from ..engine.sampling import sample_tokens
from .request import RequestState


def banned_next_tokens(context: Sequence[int], bad_sequences: Sequence[Sequence[int]]) -> list[int]:
    banned = []
    for bad in bad_sequences:
        prefix = list(bad[:-1])
        if not prefix or list(context[len(context) - len(prefix):]) == prefix:
            banned.append(bad[-1])
    return banned


def enforce_bad_words(views: Sequence[RequestState], out: StepResult) -> list[int]:
    """Mask banned next tokens in ``out.logits`` and resample the rows that hit one (in place).

    Returns the rows whose bad words ban every token at this position: nothing can be sampled
    there, and the caller ends those requests with an error rather than emit a banned token."""
    masks = [(row, banned_next_tokens(view.token_ids, view.spec.bad_sequences))
             for row, view in enumerate(views) if view.spec.bad_sequences]
    masks = [(row, banned) for row, banned in masks if banned]
    if not masks:
        return []
    out.logits = out.require_logits().clone()  # engine outputs may be inference tensors
    for row, banned in masks:
        out.logits[row, banned] = float("-inf")
    exhausted = [row for row, _ in masks if bool(torch.isneginf(out.logits[row]).all())]
    rows = [row for row, _ in masks if row not in exhausted]
    if not rows:
        return exhausted
    resampled = sample_tokens(out.logits[rows], [views[r].sampling for r in rows],
                              [int(out.positions[r]) for r in rows])
    out.sampled[rows] = resampled.to(out.sampled.dtype)
    return exhausted
