"""The receiving end of the links from the other subservers of the deployment, in this server or on
another (sending_session.py is the sending end, driven by peer_link.py).

A link is one session per sending model: it opens with a *hello* (the sender's view of the
deployment, placement.py, and its session's *epoch*), then numbers its batches 1, 2, 3, ... After a
network blip the sender reconnects with the same epoch and sends again every batch it has no answer
for, so a batch may come twice; a batch may also come before the one ahead of it. Here each batch is
applied once, in its number's order: a number already applied is answered and dropped, one that
comes early waits for the ones before it. A hello with a new epoch means the sender lost its session
(its server restarted, or it gave the peer up): whatever the old session left here is given up too.

Every call carries its sender's secret: this server start's (peer_auth.py) from a model of this server,
the pair secret (pair_secret.py) from one on another server; a hello whose view differs from this
node's is refused with the values that differ. Triton-free; the intake (intake.py) calls it from its thread.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ...placement import differences
from ...protocol import PeerMessage
from ...request_builder import RequestError
from ..peer_auth import is_secret

# Wire: request parameters of a link's calls. LINK: "<sender model>/<epoch>/<number>" (number 0: the
# hello, which carries the sender's view of the deployment as JSON in HELLO); SECRET: the sender's secret.
LINK_PARAMETER = "tokenrouter_link"
HELLO_PARAMETER = "tokenrouter_link_hello"
LINK_SECRET_PARAMETER = "tokenrouter_link_secret"
MAX_EARLY_BATCHES = 4096  # batches held for a gap; more means the sender lost some: its session is refused


def link_parameter(sender: str, epoch: str, number: int) -> str:
    return f"{sender}/{epoch}/{number}"


def link_secret_parameters(secret: str) -> dict[str, str]:
    return {LINK_SECRET_PARAMETER: secret}


class LinkRefused(RequestError):
    """A link call this node does not take; the message says why (the sender logs it)."""


@dataclass
class _Session:
    epoch: str
    applied: int = 0  # every batch up to this number has been applied
    early: dict[int, list[PeerMessage]] = field(default_factory=dict)


class PeerSessions:
    def __init__(self, view: dict[str, Any], secrets: Mapping[str, str], *, here: str,
                 on_session_lost: Callable[[str, str], None]) -> None:
        """``view``: this node's describe(); ``secrets``: each peer model's secret (the server start's
        for a model of this server, the pair secret for one on another); ``here``: this model's name
        and address, for messages; ``on_session_lost(sender, why)``: a session was replaced, so the
        requests it carried are gone."""
        self._view, self._secrets, self._here = view, dict(secrets), here
        self._on_session_lost = on_session_lost
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()

    def take(self, parameters: dict[str, Any], messages: Callable[[], list[PeerMessage]]) -> list[PeerMessage]:
        """The messages of one link call to apply now, in order (none for a hello or a duplicate).
        ``messages`` decodes the call's payload (only once the call is known to be genuine)."""
        sender, epoch, number = _parse(parameters.get(LINK_PARAMETER))
        secret = self._secrets.get(sender)
        if secret is None:
            raise LinkRefused(f"'{sender}' is not a peer model of this deployment ({self._here}); refused")
        if not is_secret(parameters.get(LINK_SECRET_PARAMETER), secret):
            raise LinkRefused(f"a link call from '{sender}' to {self._here} without its secret; refused")
        with self._lock:
            if number == 0:
                self._hello(sender, epoch, parameters.get(HELLO_PARAMETER))
                return []
            return self._batch(sender, epoch, number, messages)

    def _hello(self, sender: str, epoch: str, raw_view: Any) -> None:
        try:
            view = json.loads(raw_view)
        except (TypeError, ValueError):
            raise LinkRefused(f"a hello from '{sender}' without its view of the deployment") from None
        found = (differences(self._view, view, mine=f"at {self._here}", theirs=f"at '{sender}'")
                 if isinstance(view, dict) else ["the view is not a JSON object"])
        if found:
            raise LinkRefused(f"'{sender}' runs another deployment than {self._here}: " + "; ".join(found))
        old = self._sessions.get(sender)
        if old is None or old.epoch != epoch:
            self._sessions[sender] = _Session(epoch)
            if old is not None:
                self._on_session_lost(sender, f"'{sender}' started a new session (its server restarted or "
                                              f"lost this one)")

    def _batch(self, sender: str, epoch: str, number: int,
               messages: Callable[[], list[PeerMessage]]) -> list[PeerMessage]:
        session = self._sessions.get(sender)
        if session is None or session.epoch != epoch:
            raise LinkRefused(f"no session {epoch} of '{sender}' at {self._here} (say hello first)")
        if number <= session.applied or number in session.early:
            return []  # sent again after a reconnect: applied already
        batch = messages()
        if any(m.sender != sender for m in batch):
            raise LinkRefused(f"a batch of '{sender}' carries another sender's messages")
        if number > session.applied + 1:
            if len(session.early) >= MAX_EARLY_BATCHES:
                raise LinkRefused(f"'{sender}' left a gap after batch {session.applied}")
            session.early[number] = batch
            return []
        ready = list(batch)
        session.applied = number
        while session.applied + 1 in session.early:
            session.applied += 1
            ready += session.early.pop(session.applied)
        return ready


def _parse(raw: Any) -> tuple[str, str, int]:
    parts = raw.split("/") if isinstance(raw, str) else []
    if len(parts) != 3 or not parts[0] or not parts[1] or not parts[2].isdigit():
        raise LinkRefused(f"'{LINK_PARAMETER}' must be SENDER/EPOCH/NUMBER, got {raw!r}; refused")
    return parts[0], parts[1], int(parts[2])
