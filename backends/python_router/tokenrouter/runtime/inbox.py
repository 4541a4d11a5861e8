"""What other threads put into a subserver loop's inbox: one small frozen event per kind.

The loop (subserver.py) takes them in order and ``match``es on the type; every state change they
cause runs on the loop's thread, inside the core.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..protocol import PeerMessage
from .request import Submission


@dataclass(frozen=True, slots=True)
class Delivered:  # a peer's message about one of this model's requests
    message: PeerMessage


@dataclass(frozen=True, slots=True)
class Cancelled:  # the client went away, or a front cancelled it by its key
    rid: str


@dataclass(frozen=True, slots=True)
class Submitted:
    """A client's request for the entry model (counted in the admission bound while here)."""

    submission: Submission


@dataclass(frozen=True, slots=True)
class Failed:
    """End ``rid`` with ``error`` from outside the loop (e.g. its handoff could not be sent)."""

    rid: str
    error: str


@dataclass(frozen=True, slots=True)
class Wake:
    """Nothing to do but look at ``stopped`` again (``stop`` puts it)."""


@dataclass(frozen=True, slots=True)
class PeerLost:
    """``peer`` is unreachable: the requests that cannot go on without it end with ``error``."""

    peer: str
    error: str


@dataclass(frozen=True, slots=True)
class PeerForgot:
    """``peer`` holds nothing of ``rid`` any more (the instance that held it is gone; another one of the
    same model takes the request): it goes there whole."""

    peer: str
    rid: str


Event = Delivered | Submitted | Cancelled | Failed | PeerLost | PeerForgot | Wake
