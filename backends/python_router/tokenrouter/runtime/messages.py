"""What travels between subservers: only token suffixes and routing state, never KV.

One message type for every transport (in-process queue, Triton BLS, gRPC between servers), so it
serializes to JSON: a client-reachable endpoint must never unpickle peer input.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

MessageKind = Literal["handoff", "progress", "finish", "release", "active"]


@dataclass
class RequestSpec:
    """The immutable part of a request, sent with its first visit to a model."""

    prompt_len: int
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    end_ids: list[int] = field(default_factory=list)
    stop_sequences: list[list[int]] = field(default_factory=list)
    bad_sequences: list[list[int]] = field(default_factory=list)  # never emitted (see constraints.py)


@dataclass
class PeerMessage:
    """One subserver telling another about request ``rid``.

    kinds:
      handoff   the receiver now holds the request: append ``tokens`` at ``anchor`` and decode
      progress  tokens the holder committed (so the entry can stream them); no transfer of control
      finish    the holder finished the request (``finish_reason``); sent to the entry
      release   free the request's KV and forget it (after finish, cancel or error)
      active    the global count of active requests changed (for thresholds that depend on N)
    """

    kind: MessageKind
    rid: str
    sender: str
    anchor: int = 0
    tokens: list[int] = field(default_factory=list)
    origins: list[int] = field(default_factory=list)  # model index per token in ``tokens``; -1 = prompt
    request: RequestSpec | None = None  # present on the first visit to a model
    state: dict[str, Any] = field(default_factory=dict)  # policy extras, JSON-serializable
    finish_reason: str | None = None
    active: int | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> "PeerMessage":
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, raw: Any) -> "PeerMessage":
        if not isinstance(raw, dict):
            raise ValueError("a peer message must be a JSON object")
        raw = dict(raw)
        spec = raw.pop("request", None)
        return cls(**raw, request=RequestSpec(**spec) if spec else None)


def encode_batch(messages: list[PeerMessage]) -> bytes:
    """Several messages in one payload (one transport call per peer per flush)."""
    return ("[" + ",".join(m.to_json() for m in messages) + "]").encode()


def decode_batch(payload: str | bytes) -> list[PeerMessage]:
    raw = json.loads(payload)
    if not isinstance(raw, list):
        raise ValueError("a peer message batch must be a JSON list")
    return [PeerMessage.from_dict(item) for item in raw]
