"""OpenAI's response bodies and stream chunks for chat and text completions, with our extras.

Extras (ignored by OpenAI clients, which keep unknown fields): ``large_model_share`` on each
choice (the share of its tokens the large model wrote; in a stream, on the choice's last chunk)
and ``routing_policy`` on every body and chunk (also the ``X-TokenRouter-Policy`` header).
Stream chunks are built as bytes here, one ``data:`` event each, the way OpenAI streams them: the
role first, then content deltas, each choice's last chunk with its finish reason, the usage chunk
when ``stream_options.include_usage``, then ``data: [DONE]``.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from .generation import Piece

DONE = b"data: [DONE]\n\n"
POLICY_HEADER = "X-TokenRouter-Policy"


def event(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


@dataclass
class Envelope:
    """What every body and chunk of one response shares."""

    id: str
    object: str
    model: str
    policy: str
    created: int

    @classmethod
    def new(cls, kind: str, model: str, policy: str) -> "Envelope":
        prefix = "chatcmpl" if kind.startswith("chat") else "cmpl"
        return cls(f"{prefix}-{uuid.uuid4().hex}", kind, model, policy, int(time.time()))

    def body(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.model,
                "choices": choices, "routing_policy": self.policy, **extra}


def chat_logprobs(pieces_ids: list[int], log_probs: list[float], token_text: Callable[[int], str]) -> dict[str, Any]:
    content = []
    for token, logprob in zip(pieces_ids, log_probs):
        text = token_text(token)
        content.append({"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []})
    return {"content": content, "refusal": None}


def completion_logprobs(token_ids: list[int], log_probs: list[float], token_text: Callable[[int], str],
                        offset: int) -> dict[str, Any]:
    """The legacy shape; ``offset``: characters of the choice's text before these tokens."""
    tokens, offsets = [], []
    for token in token_ids:
        text = token_text(token)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": log_probs, "top_logprobs": None, "text_offset": offsets}


class _Chunks:
    """What the chunks of one stream share: the envelope, the usage field, the choice event."""

    def __init__(self, envelope: Envelope, token_text: Callable[[int], str], include_usage: bool) -> None:
        self._envelope, self._token_text = envelope, token_text
        self._usage = {"usage": None} if include_usage else {}  # OpenAI: null in every chunk but the last

    @property
    def include_usage(self) -> bool:
        return bool(self._usage)

    def usage(self, usage: dict[str, int]) -> bytes:
        return event(self._envelope.body([], usage=usage))

    def _event(self, choice: dict[str, Any], piece: Piece | None = None,
               usage: dict[str, int] | None = None) -> bytes:
        if piece is not None and piece.finish_reason:
            choice["large_model_share"] = piece.large_share
        return event(self._envelope.body([choice], **({"usage": usage} if usage is not None else self._usage)))


def _empty(piece: Piece) -> bool:
    """A response that released no text (held back for a stop string) and ended nothing."""
    return not piece.text and piece.finish_reason is None and not piece.token_ids


class ChatChunks(_Chunks):
    """The chunks of a streamed chat completion."""

    def role(self, index: int) -> bytes:
        return self._event({"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None})

    def piece(self, piece: Piece, usage: dict[str, int] | None = None) -> bytes | None:
        if _empty(piece):
            return None
        logprobs = chat_logprobs(piece.token_ids, piece.log_probs, self._token_text) if piece.token_ids else None
        return self._event({"index": piece.index, "delta": {"content": piece.text} if piece.text else {},
                            "logprobs": logprobs, "finish_reason": piece.finish_reason}, piece, usage)


class CompletionChunks(_Chunks):
    """The chunks of a streamed text completion (the echoed prompt first, when asked)."""

    def __init__(self, envelope: Envelope, token_text: Callable[[int], str], include_usage: bool) -> None:
        super().__init__(envelope, token_text, include_usage)
        self._offsets: dict[int, int] = {}  # per choice: characters sent, for logprobs' text_offset

    def echo(self, index: int, prompt: str) -> bytes:
        self._offsets[index] = len(prompt)
        return self._event({"index": index, "text": prompt, "logprobs": None, "finish_reason": None})

    def piece(self, piece: Piece, usage: dict[str, int] | None = None) -> bytes | None:
        if _empty(piece):
            return None
        offset = self._offsets.get(piece.index, 0)
        logprobs = (completion_logprobs(piece.token_ids, piece.log_probs, self._token_text, offset)
                    if piece.token_ids else None)
        self._offsets[piece.index] = offset + len(piece.text)
        return self._event({"index": piece.index, "text": piece.text, "logprobs": logprobs,
                            "finish_reason": piece.finish_reason}, piece, usage)


@dataclass
class ChoiceText:
    """A whole choice, for a response that does not stream."""

    index: int
    text: str = ""
    finish_reason: str | None = None
    large_share: float = 0.0
    token_ids: list[int] | None = None
    log_probs: list[float] | None = None

    def add(self, piece: Piece) -> None:
        self.text += piece.text
        self.large_share = piece.large_share
        self.finish_reason = piece.finish_reason or self.finish_reason
        if piece.token_ids:
            self.token_ids = (self.token_ids or []) + piece.token_ids
            self.log_probs = (self.log_probs or []) + piece.log_probs


def chat_body(envelope: Envelope, choices: list[ChoiceText], usage: dict[str, int], logprobs: bool,
              token_text: Callable[[int], str]) -> dict[str, Any]:
    return envelope.body([
        {"index": c.index, "message": {"role": "assistant", "content": c.text, "refusal": None},
         "logprobs": chat_logprobs(c.token_ids or [], c.log_probs or [], token_text) if logprobs else None,
         "finish_reason": c.finish_reason, "large_model_share": c.large_share} for c in choices], usage=usage)


def completion_body(envelope: Envelope, choices: list[ChoiceText], usage: dict[str, int], logprobs: bool,
                    token_text: Callable[[int], str], echoed: dict[int, str]) -> dict[str, Any]:
    body = []
    for c in choices:
        prompt = echoed.get(c.index, "")
        body.append({"index": c.index, "text": prompt + c.text, "finish_reason": c.finish_reason,
                     "logprobs": (completion_logprobs(c.token_ids or [], c.log_probs or [], token_text, len(prompt))
                                  if logprobs else None),
                     "large_model_share": c.large_share})
    return envelope.body(body, usage=usage)
