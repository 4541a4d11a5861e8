"""At a peer worker of a split pair with several entry workers: which entry instance owns each request,
read off the link calls as they arrive (each call carries its sending instance, ``origin``).

- A handoff from the entry pins its request to the sending instance, so everything the peer sends about
  it (progress, its end, a handoff back) goes to that instance alone (pinned_transport.py, a peer's).
  The entry's release unpins it. Request ids are unique across entry instances (each entry's ids carry
  its instance id: entry_engine.py), so two entries' requests never meet under one id here.
- The global N the peer's delayed batching reads is the sum of what each entry instance last told
  (each counts only its own admitted requests); a lost entry instance's count leaves the sum.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

from ..protocol import PeerMessage
from .pinned_transport import PinnedTransport


class EntryOwners:
    def __init__(self, transport: PinnedTransport, entry: str, deliver: Callable[[PeerMessage], None]) -> None:
        self._transport, self._entry, self._deliver = transport, entry, deliver
        self._lock = threading.Lock()  # calls from several entry instances may be answered at once
        self._active: dict[int, int] = {}  # entry instance -> its N

    def __call__(self, message: PeerMessage, origin: int) -> None:
        """Deliver one message of a call from entry instance ``origin`` (in the order its session applies)."""
        if message.sender == self._entry:
            if message.kind == "handoff":
                self._transport.pin(self._entry, message.rid, origin)
            elif message.kind == "release":
                self._transport.unpin(self._entry, message.rid)
            if message.active is not None:
                with self._lock:
                    self._active[origin] = message.active
                    message = dataclasses.replace(message, active=sum(self._active.values()))
        self._deliver(message)

    def entry_lost(self, origin: int) -> None:
        """Entry instance ``origin`` is gone: its N no longer counts (the transport ends its requests)."""
        with self._lock:
            if self._active.pop(origin, None) is None:
                return
            active = sum(self._active.values())
        self._deliver(PeerMessage(kind="active", rid="", sender=self._entry, active=active))

    def active(self) -> int:
        with self._lock:
            return sum(self._active.values())
