"""Stateless, UTF-8 safe detokenization of streamed chunks.

A byte-level tokenizer may split one character over several tokens, and a stream may cut between
them. Each chunk therefore carries ``prefix_ids``: up to PREFIX_TOKENS tokens emitted just before
it (a character has at most 4 bytes, so a held-back partial character always fits). With
E(ids) = decode(ids) minus trailing U+FFFD (kept when the chunk is final):

    chunk text = E(prefix_ids + output_ids)[len(E(prefix_ids)):]

Concatenating the chunk texts of a stream gives decode(all ids): a partial character is held back
by E until the chunk that completes it, and no state is kept between chunks, so any
postprocessing instance can serve any chunk.
"""

from __future__ import annotations

from typing import Sequence

from ...text import TextCodec
from ..schema import PREFIX_TOKENS


def prefix_window(ids: Sequence[int], start: int) -> list[int]:
    """The prefix_ids for a chunk that begins at position ``start`` of ``ids``."""
    return list(ids[max(0, start - PREFIX_TOKENS):start])


def chunk_text(codec: TextCodec, prefix_ids: Sequence[int], output_ids: Sequence[int], is_final: bool) -> str:
    """The text that a chunk adds to the stream (see the module docstring)."""
    before = codec.stable_text(prefix_ids, final=False)
    return codec.stable_text([*prefix_ids, *output_ids], final=is_final)[len(before):]
