"""How peer messages reach another subserver. One interface; the decoding loop never waits on it.

In-process (embedded API): straight into the peer's inbox, through the same JSON encoding the
Triton transport uses, so policy state that would not survive a process boundary fails here too.
Under Triton, one transport (``tokenrouter.serving.subserver.placed_transport``: a session per peer
over a BLS channel in one server, Triton's gRPC stream between servers) carries them.
"""

from __future__ import annotations

import abc
from typing import Callable, Sequence

from ..protocol import PeerMessage

Deliver = Callable[[PeerMessage], None]


class PeerUnreachable(ConnectionError):
    """The peer cannot be reached now (its server is down or not connected yet); the message says why."""


class Transport(abc.ABC):
    @abc.abstractmethod
    def send(self, peer: str, messages: Sequence[PeerMessage]) -> None:
        """Queue ``messages`` for ``peer``, in order and together (a step's messages to one peer:
        one call between processes); must not block on the peer's compute."""

    def close(self) -> None:
        """Flush and stop background senders, if any."""


class InProcessTransport(Transport):
    def __init__(self) -> None:
        self._inboxes: dict[str, Deliver] = {}

    def connect(self, name: str, deliver: Deliver) -> None:
        self._inboxes[name] = deliver

    def send(self, peer: str, messages: Sequence[PeerMessage]) -> None:
        if peer not in self._inboxes:
            raise KeyError(f"no subserver named '{peer}' (known: {', '.join(self._inboxes)})")
        for message in messages:
            self._inboxes[peer](PeerMessage.from_json(message.to_json()))
