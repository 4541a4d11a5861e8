"""What policies and the runtime agree on; a leaf module (it imports nothing from this project).

``policies`` and ``runtime`` both depend on this module and never on each other, so either package
imports alone (``tests/runtime/test_protocol.py`` checks it in a fresh interpreter).

- ``RequestSpec``: the immutable part of a request.
- ``PeerMessage``: what travels between subservers (token suffixes and policy state, never KV).
  It serializes to JSON: a client-reachable endpoint must never unpickle peer input.
- ``RequestView``: a read-only view of one request for policies.
- ``Route``: a policy's decision for one row: where it goes, and explicitly what else changes.
- ``Policy``: the interface the runtime calls (``policies.base.RoutingPolicy`` implements it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Literal, Protocol, overload

MessageKind = Literal["handoff", "progress", "ended", "release", "active", "estimates"]


@dataclass(frozen=True)
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
    bad_sequences: list[list[int]] = field(default_factory=list)  # never emitted (see runtime/constraints.py)
    # TensorRT-LLM's sampling inputs; every model of the route applies them, so routed output stays
    # one function of (prompt, parameters, seed).
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0  # end ids are not sampled before this many output tokens
    logit_bias: list[tuple[int, float]] = field(default_factory=list)  # (token id, added to its logit)
    return_log_probs: bool = False  # the client wants each output token's log probability


@dataclass
class PeerMessage:
    """One subserver telling another about request ``rid``.

    kinds:
      handoff   the receiver now holds the request: make its context ``context[:anchor] + tokens``
                and decode. ``keep_sampled`` says whether the last of ``tokens`` is the token the
                sender sampled in its last step (then the sender committed it as it left);
                otherwise the receiver regenerates that position.
      progress  tokens the holder committed (so the entry can stream them); no transfer of control
      ended     the request ended at its holder, finished or failed (``finish_reason``, "error" for a
                failure); sent to the entry, which ends it everywhere
      release   free the request's KV and forget it (after it finished, was cancelled or failed)
      active    the global count of active requests changed (for thresholds that depend on N)
      estimates what the sender observed of its own model, in ``state`` (for ``batch_threshold:
                auto`` when each model runs in its own process)
    """

    kind: MessageKind
    rid: str
    sender: str
    anchor: int = 0
    tokens: list[int] = field(default_factory=list)
    origins: list[int] = field(default_factory=list)  # model index per token in ``tokens``; -1 = prompt
    # Parallel to ``tokens`` when the request returns log probabilities (None at prompt positions),
    # else empty: each output token's log probability at the model that sampled it.
    logprobs: list[float | None] = field(default_factory=list)
    request: RequestSpec | None = None  # present on the first visit to a model
    state: dict[str, Any] = field(default_factory=dict)  # policy extras, JSON-serializable
    keep_sampled: bool = False
    finish_reason: str | None = None
    active: int | None = None

    @property
    def end(self) -> int:
        """Context length after the receiver applies this message."""
        return self.anchor + len(self.tokens)

    def to_json(self) -> str:
        # Shallow on purpose: asdict would deep-copy every token list element by element, which was
        # most of what a handoff cost. ``state`` must be plain JSON already (it crosses processes).
        data = dict(vars(self))
        if self.request is not None:
            data["request"] = asdict(self.request)
        return json.dumps(data, separators=(",", ":"))

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


class ReadOnlyTokens(Sequence[int]):
    """A list seen without the right to change it (no copy: views are built every step)."""

    __slots__ = ("_items",)

    def __init__(self, items: Sequence[int]) -> None:
        self._items = items

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index):
        value = self._items[index]
        return list(value) if isinstance(index, slice) else value

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[int]:  # Sequence's own goes through __getitem__, one index at a time
        return iter(self._items)

    def __eq__(self, other: object) -> bool:
        return list(self._items) == list(other) if isinstance(other, Sequence) else NotImplemented

    def __repr__(self) -> str:
        return f"ReadOnlyTokens({list(self._items)!r})"


@dataclass(frozen=True)
class RequestView:
    """What a policy sees of one request on the model that holds it; read-only.

    A policy changes a request only through what it returns: ``Route.state`` for its own
    per-request state and ``Route.token`` to replace the sampled token.
    """

    rid: str
    model: str  # the model holding the request now
    model_index: int  # its position in the config's model list (used for attribution)
    token_ids: Sequence[int]  # committed context: prompt + committed output tokens
    prompt_len: int
    origins: Sequence[int]  # model index that produced each committed output token
    spec: RequestSpec
    state: Mapping[str, Any] = field(default_factory=dict)  # policy-owned; travels with the request
    known: Mapping[str, int] = field(default_factory=dict)  # tokens each peer has seen (its anchor)
    sampled_token: int | None = None  # sampled in this step at ``model``; not committed yet
    # Per committed output token when ``spec.return_log_probs`` (else empty), and the sampled token's.
    logprobs: Sequence[float] = ()
    sampled_logprob: float | None = None

    def __post_init__(self) -> None:
        # Exact type checks on purpose: isinstance against the collections ABCs costs more than
        # the rest of a view, and the runtime builds one for every row of every step.
        for name in ("token_ids", "origins", "logprobs"):
            value = getattr(self, name)
            if type(value) is not ReadOnlyTokens:
                object.__setattr__(self, name, ReadOnlyTokens(value))
        for name in ("state", "known"):
            value = getattr(self, name)
            if type(value) is not MappingProxyType:
                object.__setattr__(self, name, MappingProxyType(value if type(value) is dict else dict(value)))

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - self.prompt_len

    def message_to(self, peer: str, *, keep_sampled: bool = True,
                   state: Mapping[str, Any] | None = None) -> PeerMessage:
        """The handoff to ``peer``: every committed token ``peer`` has not seen, plus the sampled
        token when ``keep_sampled`` (then it is committed here, attributed to this model)."""
        sampled = self.sampled_token if keep_sampled else None
        keep = sampled is not None
        anchor = self.known.get(peer, 0)
        # Only the suffix after the anchor is built: a request's whole context is seen every handoff.
        prompt_left, output_from = max(self.prompt_len - anchor, 0), max(anchor - self.prompt_len, 0)
        tokens = [*self.token_ids[anchor:]]
        origins = [*([-1] * prompt_left), *self.origins[output_from:]]
        if sampled is not None:
            tokens.append(sampled)
            origins.append(self.model_index)
        logprobs: list[float | None] = []
        if self.spec.return_log_probs:
            logprobs = [*([None] * prompt_left), *self.logprobs[output_from:],
                        *([self.sampled_logprob] if keep else [])]
        return PeerMessage(kind="handoff", rid=self.rid, sender=self.model, anchor=anchor, tokens=tokens,
                           origins=origins, request=self.spec if anchor == 0 else None,
                           state=dict(self.state if state is None else state), keep_sampled=keep,
                           logprobs=logprobs)


@dataclass(frozen=True)
class Route:
    """A policy's decision for one row of a step.

    ``destination``: the model that decodes next (the current model = keep decoding here).
    ``state``: the request's policy state from now on (None: unchanged).
    ``token``: replaces the token the engine sampled (None: keep it); ensembles sample their mixture.
    """

    destination: str
    state: Mapping[str, Any] | None = None
    token: int | None = None


def as_route(decision: str | Route) -> Route:
    """A policy may return a bare model name where nothing but the destination is decided."""
    return decision if isinstance(decision, Route) else Route(decision)


class Policy(Protocol):
    """What the runtime calls on a routing policy (see policies/base.py for the full story)."""

    name: ClassVar[str]
    needs_hidden: bool
    top_logits: int
    needs_logits: bool

    def route(self, batch: Sequence[RequestView], out: Any) -> Sequence[str | Route]: ...

    def send(self, request: RequestView, peer: str) -> PeerMessage: ...

    def receive(self, request: RequestView, message: PeerMessage) -> list[int]: ...
