"""What crosses an engine process's socket (process_engine.py): one frozen dataclass per message.

The parent sends ``Start`` once, then ``Call``s, then ``Close``; the child answers ``Start`` and each
``Call`` with ``Returned`` or ``Raised``, carrying the engine's free-block count after the call (None
before there is an engine) so that the parent's mirror of it never costs a round trip. Both ends are
our own code, so a message is pickled whole: its class costs a few dozen bytes once per message, and
the fields (a step's rows, its result) are pickled as they are, never copied first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


# --- parent -> child -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Start:
    """Build engine ``name`` from ``spec`` (a ``ModelSpec``'s fields) and answer with its shape facts."""

    name: str
    spec: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Call:
    """Call the engine's ``method`` (or read that attribute) with ``args`` and ``kwargs``."""

    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Close:  # close the engine and end the process (no answer)
    pass


ToEngine = Start | Call | Close


# --- child -> parent -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Returned:
    value: Any
    free_blocks: int | None


@dataclass(frozen=True, slots=True)
class Raised:
    """The call raised ``error`` (raised again in the parent)."""

    error: BaseException
    free_blocks: int | None


FromEngine = Returned | Raised
