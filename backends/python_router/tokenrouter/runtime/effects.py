"""What the subserver core asks its loop to do. The core decides; the loop performs.

The core never calls an engine step, a transport or a client sink itself: every event handler
returns a list of these, in the order they must happen.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.base import StepRow
from ..protocol import PeerMessage
from .request import ClientSink


@dataclass(frozen=True)
class Send:
    """Post ``message`` to ``peer`` through the transport."""

    peer: str
    message: PeerMessage


@dataclass(frozen=True)
class Emit:
    """Hand output to one client's sink (entry only). A sink that raises cancels its request."""

    rid: str
    sink: ClientSink
    tokens: list[int]
    origins: list[int]
    finish_reason: str | None = None
    error: str | None = None
    logprobs: list[float] | None = None  # parallel to tokens when the request returns log probabilities


@dataclass(frozen=True)
class Release:
    """Free the request's KV in this model's engine (idempotent)."""

    rid: str


@dataclass(frozen=True)
class Routed:
    """A step was routed: where every finished row went and how many tokens it committed here
    (for observers such as the online threshold estimator)."""

    destinations: list[str]
    committed: list[int]
    decode_only: bool  # every row fed one token: the step's latency is a decode step's


Effect = Send | Emit | Release | Routed


@dataclass(frozen=True)
class Batch:
    """The next engine step: one row per request, with how many of its pending tokens it feeds."""

    rows: list[StepRow[str]]
    needs_logits: bool = True  # whether anything after the step reads the full-vocabulary logits

    @property
    def rids(self) -> list[str]:
        return [row.seq_id for row in self.rows]
