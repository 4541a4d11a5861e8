"""Workloads: what each closed-loop client asks, request after request.

  short-long   short prompts, long outputs (reasoning-like)
  long-short   long inputs, short outputs (agentic-like)
  multi-turn   a conversation: each turn appends the previous answer and a new user turn

Prompts are token ids from a seeded generator on the simulated engine (it has no tokenizer) and
real text on real engines: pieces of the Python standard library's sources (code, and the same on
every machine with this Python). Every client draws from its own seeded generator, so a run is
reproducible up to timing.
"""

from __future__ import annotations

import random
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Protocol

from .records import Prompt, RequestRecord

KINDS = ("short-long", "long-short", "multi-turn")
# Code through a BPE tokenizer: 3.6-4.3 characters per token on average, 2.2 at worst (measured on
# these prompts with the tiny and the Qwen2.5 tokenizers). Prompts are cut at the average; whether a
# conversation still fits is judged at the worst case.
CHARS_PER_TOKEN = 3.5
MIN_CHARS_PER_TOKEN = 2.0


@dataclass(frozen=True)
class Workload:
    kind: str
    prompt_tokens: tuple[int, int]  # a new prompt (or user turn) has this many tokens, about
    max_tokens: int
    turns: int = 1  # multi-turn: turns per conversation
    max_context: int = 4096  # prompt + output must fit; a conversation that would not restarts

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown workload '{self.kind}'; allowed: {', '.join(KINDS)}")


class PromptSource(Protocol):
    def make(self, rng: random.Random, tokens: int) -> Prompt: ...

    def join(self, *parts: Prompt) -> Prompt: ...

    def size(self, prompt: Prompt) -> int:
        """Tokens in ``prompt`` (for text: an upper estimate)."""
        ...


class TokenPrompts:
    """Token ids in [0, vocab) without the end-of-sequence id (a prompt must not end a request)."""

    def __init__(self, vocab_size: int, eos_id: int) -> None:
        self.vocab_size, self.eos_id = vocab_size, eos_id

    def make(self, rng: random.Random, tokens: int) -> list[int]:
        ids = [rng.randrange(self.vocab_size - 1) for _ in range(tokens)]
        return [t + 1 if t >= self.eos_id else t for t in ids]

    def join(self, *parts: Prompt) -> list[int]:
        joined: list[int] = []
        for part in parts:
            if isinstance(part, str):  # not reached: every target answers a token-id prompt with ids
                raise TypeError(f"a token-id conversation got text: {part[:40]!r}")
            joined.extend(part)
        return joined

    def size(self, prompt: Prompt) -> int:
        return len(prompt)


class TextPrompts:
    """Consecutive lines of a standard-library module, about ``tokens`` tokens long."""

    def make(self, rng: random.Random, tokens: int) -> str:
        files = _stdlib_sources()
        want = int(tokens * CHARS_PER_TOKEN)
        while True:
            lines = files[rng.randrange(len(files))].splitlines(keepends=True)
            start = rng.randrange(len(lines))
            text = ""
            for line in lines[start:]:
                if len(text) >= want:
                    break
                text += line
            if len(text) >= want // 2 and text.strip():  # near a file's end: try elsewhere
                return text[:want]

    def join(self, *parts: Prompt) -> str:
        return "\n".join(str(part) for part in parts)

    def size(self, prompt: Prompt) -> int:
        return int(len(prompt) / MIN_CHARS_PER_TOKEN) + 1


@lru_cache(maxsize=1)
def _stdlib_sources() -> list[str]:
    paths = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    return [p.read_text(encoding="utf-8", errors="replace") for p in paths]


class Session:
    """One client's stream of prompts."""

    def __init__(self, workload: Workload, source: PromptSource, seed: int, client: int) -> None:
        self.workload, self.source = workload, source
        self.rng = random.Random(f"{seed}/{workload.kind}/{client}")
        self._context: Prompt | None = None  # multi-turn: the last turn's prompt
        self._turn = 0

    def next_prompt(self, previous: RequestRecord | None) -> Prompt:
        """The next request's prompt; ``previous`` is this client's last request (its answer)."""
        w = self.workload
        turn = self.source.make(self.rng, self.rng.randint(*w.prompt_tokens))
        if w.kind == "multi-turn" and self._context is not None and previous is not None and previous.complete \
                and self._turn < w.turns:
            prompt = self.source.join(self._context, previous.output, turn)
            if self.source.size(prompt) + w.max_tokens <= w.max_context:
                self._context, self._turn = prompt, self._turn + 1
                return prompt
        self._context, self._turn = turn, 1  # a new conversation (or a single-turn workload)
        return turn
