"""The transport of a subserver whose peers may run on other Triton servers (placement.py): peers
in this server by BLS (bls_transport.py), each peer on another server by its link (peer_link.py)."""

from __future__ import annotations

from typing import Sequence

from ...protocol import PeerMessage
from ...runtime.transport import Transport
from .peer_link import PeerLink


class PlacedTransport(Transport):
    def __init__(self, local: Transport) -> None:
        self._local = local
        self._links: dict[str, PeerLink] = {}

    def add_link(self, link: PeerLink) -> None:
        """Before the subserver starts: messages to ``link.peer`` go through it from now on."""
        self._links[link.peer] = link

    def problem(self) -> str | None:
        """Why the deployment is not whole now (a peer server not connected), or None."""
        return next((p for link in self._links.values() if (p := link.problem) is not None), None)

    def send(self, peer: str, messages: Sequence[PeerMessage]) -> None:
        link = self._links.get(peer)
        if link is None:
            self._local.send(peer, messages)
        else:
            link.send(messages)

    def close(self) -> None:
        for link in self._links.values():
            link.close()
        self._local.close()
