"""One direction of a peer pair: this subserver's messages to another subserver of the deployment,
over one channel at a time (bls_channel.py: BLS calls within this server; grpc_channel.py: Triton's
ModelStreamInfer into a model on another server). The session protocol (numbered, answered and
resent batches, heartbeat, give-up) is sending_session.py's; peer_sessions.py is the other end.
This module is its thread:

- **Never blocks the decoding loop**: ``send`` only queues; the link's thread hands the session the
  queued messages, the channel's answers and breaks, and the time. Everything queued when it wakes
  (a step's messages to this peer, or several steps') goes in one call, without waiting for the
  answer to the one before (unless the channel's pacing keeps fewer calls in flight).
- While the session is lost (or not up yet) messages to the peer are dropped, and one that is a
  handoff loses the peer at once (``on_down``: its request ends with the others away there); the
  peer's end gives up the lost session's requests by itself. (Unless the channel's pacing holds them
  while connecting: sending_session.py, ``Pacing``.)
- ``delay_s`` holds every batch that long before it is sent (measurements: a network's latency).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ...protocol import PeerMessage
from .sending_session import BETWEEN_SERVERS, CONNECTING, Channel, OpenChannel, Pacing, SendingSession

log = logging.getLogger(__name__)


# The link thread's inbox: one frozen event per kind.
@dataclass(frozen=True, slots=True)
class _Queued:
    """Messages to ship no earlier than ``due``, for the session ``epoch`` they were queued in."""

    epoch: str
    due: float
    messages: list[PeerMessage]


@dataclass(frozen=True, slots=True)
class _Answered:
    """The peer answered call ``number`` (None: a refusal that did not echo it) of session ``epoch``."""

    epoch: str
    number: int | None
    error: str | None


@dataclass(frozen=True, slots=True)
class _Close:
    pass


@dataclass(frozen=True, slots=True)
class _Broken:  # stream ``channel`` (its count) ended
    channel: int
    reason: str


_Event = _Queued | _Answered | _Broken | _Close


class PeerLink:
    def __init__(self, name: str, peer: str, address: str, open_channel: OpenChannel, *, secret: str,
                 view: dict[str, Any], down_after_s: float, delay_s: float = 0.0,
                 on_up: Callable[[str], None], on_down: Callable[[str, str], None],
                 on_round_trip: Callable[[float], None] | None = None, pacing: Pacing = BETWEEN_SERVERS) -> None:
        """``on_down(peer, error)``: the peer is lost, end what is away at it (the one consequence of
        any failure to deliver); ``on_up(peer)``: connected; ``pacing``: how the session uses this
        kind of channel."""
        self.name, self.peer, self.address = name, peer, address
        self._open = open_channel
        self._delay_s = delay_s
        self._on_down = on_down
        self._events: queue.Queue[_Event] = queue.Queue()
        self._session = SendingSession(name, peer, address, self._open_channel, secret=secret, view=view,
                                       down_after_s=down_after_s, on_up=on_up, on_down=on_down,
                                       on_round_trip=on_round_trip, pacing=pacing)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"link-to-{peer}", daemon=True)
        self._thread.start()

    # --- any thread -------------------------------------------------------------------------------------
    @property
    def state(self) -> str:
        return self._session.state

    @property
    def problem(self) -> str | None:
        """Why the peer cannot take messages now (None: it can)."""
        return self._session.unreachable()

    def send(self, messages: Sequence[PeerMessage]) -> None:
        epoch = self._session.epoch
        if self._session.state == CONNECTING and not self._session.pacing.hold_while_connecting:
            # The loss of the last session ended what was away at the peer then: this ends the handoffs since.
            if any(m.kind == "handoff" for m in messages):
                self._on_down(self.peer, self.problem or f"model '{self.peer}' at {self.address} is not connected")
            return
        self._events.put(_Queued(epoch, time.monotonic() + self._delay_s, list(messages)))

    def close(self) -> None:
        self._closed = True
        self._events.put(_Close())
        self._thread.join(timeout=5)

    # --- the link's thread --------------------------------------------------------------------------------
    def _run(self) -> None:
        session = self._session
        while not self._closed:
            try:
                event = self._events.get(timeout=max(0.0, session.next_wakeup(time.monotonic()) - time.monotonic()))
            except queue.Empty:
                event = None
            try:
                while event is not None:
                    self._handle(event)
                    event = self._events.get_nowait()
            except queue.Empty:
                pass
            try:
                session.tick(time.monotonic())
            except Exception:  # noqa: BLE001 - a bug must not end the link: the peer would hang
                log.exception("%s -> %s: link step failed", self.name, self.peer)
                session.lose("internal error in the link (see the log)", time.monotonic())
        session.close()

    def _handle(self, event: _Event) -> None:
        match event:
            case _Queued(epoch, due, messages):
                self._session.queued(epoch, due, messages)
            case _Answered(epoch, number, error):
                self._session.answered(epoch, number, error, time.monotonic())
            case _Broken(channel, reason):
                self._session.broken(channel, reason, time.monotonic())
            case _Close():
                pass  # ``closed`` is set: the loop ends after this round

    def _open_channel(self, epoch: str, channel: int) -> Channel:
        """A stream whose answers and breaks come back to this thread, tagged with ``epoch`` and ``channel``."""
        return self._open(lambda number, error: self._events.put(_Answered(epoch, number, error)),
                          lambda reason: self._events.put(_Broken(channel, reason)))
