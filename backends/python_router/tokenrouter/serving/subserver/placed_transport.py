"""The transport of a subserver: one peer link (peer_link.py, one session protocol) per peer model,
each over the channel its placement (placement.py) calls for: BLS to a model of this server
(bls_channel.py, with this server start's secret), Triton's gRPC stream to a model on another server
(grpc_channel.py, with the pair secret)."""

from __future__ import annotations

from typing import Sequence

from ...protocol import PeerMessage
from ...runtime.transport import PeerUnreachable, Transport
from .peer_link import PeerLink


class PlacedTransport(Transport):
    def __init__(self) -> None:
        self._links: dict[str, PeerLink] = {}
        self._remote: list[PeerLink] = []

    def add_link(self, link: PeerLink, *, remote: bool) -> None:
        """Before the subserver starts: messages to ``link.peer`` go through it. A ``remote`` link's
        problems make the deployment not whole (a peer in this server is loaded, or the server is down)."""
        self._links[link.peer] = link
        if remote:
            self._remote.append(link)

    def problem(self) -> str | None:
        """Why the deployment is not whole now (a peer server not connected), or None."""
        return next((p for link in self._remote if (p := link.problem) is not None), None)

    def send(self, peer: str, messages: Sequence[PeerMessage]) -> None:
        link = self._links.get(peer)
        if link is None:
            raise PeerUnreachable(f"'{peer}' is not a peer model of this deployment")
        link.send(messages)

    def close(self) -> None:
        for link in self._links.values():
            link.close()
