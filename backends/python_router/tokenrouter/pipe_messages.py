"""The check at the receiving end of our own process pipes (an engine's process: engine/process_messages.py;
a Dynamo worker's pair process: fleet/pair_messages.py): a message is one of the kinds that end takes.

Both ends are our own code and each message is a frozen dataclass, so another kind means the two ends
run different code (or a bug): it is said, naming what came and what was expected, never guessed at.
"""

from __future__ import annotations

from types import UnionType
from typing import Any, get_args


class UnknownMessage(TypeError):
    """A message of a kind this end of the pipe does not take."""


def expect(message: object, kinds: type | UnionType, receiver: str) -> Any:
    """``message`` if it is one of ``kinds``; UnknownMessage otherwise (``receiver`` says which end)."""
    if not isinstance(message, kinds):
        expected = ", ".join(kind.__name__ for kind in get_args(kinds) or (kinds,))
        raise UnknownMessage(f"{receiver} got a message of type {type(message).__name__}; it takes {expected} only "
                             f"(do both ends run the same code?)")
    return message
