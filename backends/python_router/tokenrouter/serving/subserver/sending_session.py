"""The sending end of a peer session, without threads or clocks: peer_link.py drives it from its
one thread with the time; peer_sessions.py is the receiving end. Whatever carries the calls is a
``Channel`` (grpc_channel.py: Triton's stream between servers; a channel only has to deliver a
numbered call and report its answer), so the protocol below holds over any of them; bls_channel.py:
a BLS call into a peer model of the same server. A channel's ``Pacing`` says how the session uses it.

- A session (random *epoch*) opens with a hello (number 0) carrying this node's view of the
  deployment; its batches are numbered 1, 2, 3, ... and the peer answers each. Unanswered batches
  are kept; after a new stream on the same session they all go again, in order (the receiver
  applies each once, in its number's order).
- **Liveness**: a heartbeat (an empty batch) goes out when nothing else did for a quarter of
  ``down_after_s``; a broken stream is reopened at once, then with a growing delay.
- **Give-up**: no answer for ``down_after_s`` (or no new stream within it, or messages held that long
  for a session that does not come up) loses the session: what it had not sent is dropped,
  ``on_down(peer, error)`` is the one consequence (``Subserver.peer_lost``: every request away at the
  peer ends with that error, the dropped handoffs' included), and a new session is tried until the
  peer answers (``on_up``).
"""

from __future__ import annotations

import itertools
import json
import logging
import secrets
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from ...protocol import PeerMessage, encode_batch
from .peer_sessions import HELLO_PARAMETER, LINK_PARAMETER, link_parameter, link_secret_parameters

log = logging.getLogger(__name__)

CONNECTING, UP, RECONNECTING = "connecting", "up", "reconnecting"
FIRST_RETRY_S, MAX_RETRY_S = 0.05, 2.0


class Channel(Protocol):
    """One open stream to the peer: it delivers call ``number`` (its payload and parameters) and
    reports the peer's answer to it, or that the stream broke, through the callbacks it was opened with."""

    def send(self, number: int, payload: bytes, parameters: dict[str, str]) -> None: ...

    def close(self) -> None: ...


# open_channel(on_answer(number or None, error or None), on_broken(reason)) -> Channel. Both callbacks
# may run on any thread; a refusal of a call whose number the server did not echo comes as None.
OpenChannel = Callable[[Callable[[int | None, str | None], None], Callable[[str], None]], Channel]


@dataclass(frozen=True)
class Pacing:
    """How a session uses its kind of channel.

    ``in_flight``: the most batches sent and not answered yet (None: no limit); what is queued
    meanwhile goes in one batch once there is room (a channel that carries one call at a time would
    only queue more calls). ``max_retry_s``: the longest wait between two tries to open a stream or a
    session. ``hold_while_connecting``: messages queued while the session is connecting wait for it
    (up to ``down_after_s``, then the peer is lost) instead of losing the peer at once: a peer in the
    same server is only loading, where a peer server may be down for long."""

    in_flight: int | None = None
    max_retry_s: float = MAX_RETRY_S
    hold_while_connecting: bool = False


BETWEEN_SERVERS = Pacing()


@dataclass
class _Sent:
    payload: bytes
    sent_at: float


class SendingSession:
    def __init__(self, name: str, peer: str, address: str, open_channel: Callable[[str, int], Channel], *, secret: str,
                 view: dict[str, Any], down_after_s: float, on_up: Callable[[str], None],
                 on_down: Callable[[str, str], None], on_round_trip: Callable[[float], None] | None = None,
                 pacing: Pacing = BETWEEN_SERVERS) -> None:
        """``open_channel(epoch, channel)`` opens a stream whose answers and breaks the driver hands
        back (``answered``, ``broken``) with that epoch and channel count. ``secret``: what the peer
        takes this node's calls by (peer_sessions.py: the server start's secret within a server, the
        pair secret between servers)."""
        self.name, self.peer, self.address = name, peer, address
        self._open = open_channel
        self.pacing = pacing
        self._secret_parameters = link_secret_parameters(secret)
        self._hello = json.dumps(view, sort_keys=True)
        self._down_after_s, self._heartbeat_s = down_after_s, down_after_s / 4
        self._on_up, self._on_down = on_up, on_down
        self._on_round_trip = on_round_trip
        # read by any thread (PeerLink.send), written here only
        self.state = CONNECTING
        self.epoch = ""
        self._problem = "not connected yet"  # the last reason it is not up
        self._numbers = itertools.count(1)
        self._unanswered: OrderedDict[int, _Sent] = OrderedDict()
        self._pending: deque[tuple[float, list[PeerMessage]]] = deque()  # (due, messages) not sent yet
        self._channel: Channel | None = None
        self._channels = itertools.count(1)  # which stream a "broken" report is about
        self._channel_id = 0
        self._hello_sent_at: float | None = None
        self._retry_at = 0.0
        self._retry_s = FIRST_RETRY_S
        self._trouble_since = 0.0
        self._last_sent = 0.0
        self._told: str | None = None  # the last problem logged (a refusal repeats every retry)
        self._new_session()

    def unreachable(self) -> str | None:
        """Why the peer cannot take messages now (None: it can)."""
        if self.state == CONNECTING:
            return f"model '{self.peer}' at {self.address} is not connected: {self._problem}"
        return None

    def queued(self, epoch: str, due: float, messages: list[PeerMessage]) -> None:
        """Messages to ship no earlier than ``due``, queued while session ``epoch`` was current."""
        if epoch != self.epoch:
            return  # that session was lost after they were queued: its on_down ended their requests
        self._pending.append((due, messages))

    def answered(self, epoch: str, number: int | None, error: str | None, now: float) -> None:
        """The peer answered call ``number`` (None: a refusal that did not echo it) of session ``epoch``."""
        if epoch != self.epoch:
            return
        hello_outstanding = self._hello_sent_at is not None
        if error is not None:
            if hello_outstanding and number in (0, None):  # the peer refused this session
                self._tell(f"refused by {self.address}: {error}")
                if self.state == RECONNECTING:
                    self.lose(f"refused by {self.address}: {error}", now)
                else:
                    self._problem = f"refused by {self.address}: {error}"
                    self._close_channel()
                    self._retry_at = now + self.pacing.max_retry_s
            else:
                self.lose(f"it refused a batch: {error}", now)
            return
        if number == 0:
            if hello_outstanding:  # (a late answer to an earlier stream's hello changes nothing)
                self._connected(now)
        elif number is not None and (sent := self._unanswered.pop(number, None)) is not None \
                and self._on_round_trip is not None:
            self._on_round_trip(now - sent.sent_at)

    def broken(self, channel: int, reason: str, now: float) -> None:
        """Stream ``channel`` (its count) ended."""
        if channel == self._channel_id and self._channel is not None:
            self._drop_channel(f"the stream broke ({reason})", now)

    def tick(self, now: float) -> None:
        """Ship what is due, keep the session alive, give it up, or reconnect."""
        if self.state == UP:
            oldest = next(iter(self._unanswered.values()), None)
            if oldest is not None and now - oldest.sent_at > self._down_after_s:
                self.lose(f"no answer for {self._down_after_s:g} s", now)
                return
            if not self._has_room():  # the unanswered batches check the peer meanwhile
                return
            if self._pending and self._pending[0][0] <= now:
                self._ship(now)
            elif now - self._last_sent >= self._heartbeat_s:
                self._ship(now, heartbeat=True)
            return
        if self.state == CONNECTING and self._pending and now - self._pending[0][0] > self._down_after_s:
            self.lose(f"{self._problem}; messages waited {self._down_after_s:g} s for it", now)
            return
        if self.state == RECONNECTING and now - self._trouble_since > self._down_after_s:
            self.lose(f"{self._problem}, and no new stream within {self._down_after_s:g} s", now)
        if self._hello_sent_at is not None and now - self._hello_sent_at > self._down_after_s:
            self._drop_channel(f"no answer to the hello within {self._down_after_s:g} s", now)
        if self._channel is None and now >= self._retry_at:
            self._connect(now)

    def next_wakeup(self, now: float) -> float:
        """When ``tick`` has something to do next (unless an event comes first)."""
        if self.state == UP:
            times = []
            if self._has_room():
                times.append(self._last_sent + self._heartbeat_s)
                if self._pending:
                    times.append(self._pending[0][0])
            if self._unanswered:
                times.append(next(iter(self._unanswered.values())).sent_at + self._down_after_s)
            return min(times)
        times = [self._retry_at if self._channel is None else now + 0.05]
        if self.state == RECONNECTING:
            times.append(self._trouble_since + self._down_after_s)
        elif self._pending:  # held while connecting: the peer is lost when the wait is over
            times.append(self._pending[0][0] + self._down_after_s)
        return min(times)

    def lose(self, reason: str, now: float) -> None:
        """Give the session up: what it carried is lost on both ends (``on_down``; the messages not sent
        are dropped); a new one starts when the peer answers."""
        self._close_channel()
        self._problem = reason
        self.state = CONNECTING
        self._new_session()
        self._retry_at = now + self._retry_s
        log.error("%s -> %s at %s: lost (%s)", self.name, self.peer, self.address, reason)
        self._on_down(self.peer, f"model '{self.peer}' at {self.address} is unreachable: {reason}")

    def close(self) -> None:
        self._close_channel()

    def _connect(self, now: float) -> None:
        channel = next(self._channels)
        try:
            self._channel = self._open(self.epoch, channel)
        except Exception as exc:  # noqa: BLE001 - e.g. unreadable TLS files: said, and tried again
            self._problem = f"cannot open a stream: {type(exc).__name__}: {exc}"
            self._tell(self._problem)
            self._retry_at, self._retry_s = now + self._retry_s, min(self._retry_s * 2, self.pacing.max_retry_s)
            return
        self._channel_id = channel
        self._hello_sent_at = now
        self._channel.send(0, b"[]", {**self._secret_parameters, HELLO_PARAMETER: self._hello,
                                      LINK_PARAMETER: link_parameter(self.name, self.epoch, 0)})

    def _connected(self, now: float) -> None:
        was = self.state
        self._hello_sent_at, self._retry_s, self._told = None, FIRST_RETRY_S, None
        self.state = UP
        for number, sent in self._unanswered.items():  # the same session: whatever may be lost goes again
            sent.sent_at = now
            self._live_channel().send(number, sent.payload, self._batch_parameters(number))
        self._last_sent = now
        if was == CONNECTING:
            log.info("%s -> %s at %s: connected", self.name, self.peer, self.address)
            self._on_up(self.peer)
        else:
            log.info("%s -> %s at %s: reconnected, %d batch(es) sent again", self.name, self.peer,
                     self.address, len(self._unanswered))

    def _ship(self, now: float, heartbeat: bool = False) -> None:
        messages: list[PeerMessage] = []
        while not heartbeat and self._pending and self._pending[0][0] <= now:
            messages += self._pending.popleft()[1]
        number = next(self._numbers)
        payload = encode_batch(messages)
        self._unanswered[number] = _Sent(payload, now)
        self._last_sent = now
        self._live_channel().send(number, payload, self._batch_parameters(number))

    def _batch_parameters(self, number: int) -> dict[str, str]:
        return {**self._secret_parameters, LINK_PARAMETER: link_parameter(self.name, self.epoch, number)}

    def _drop_channel(self, reason: str, now: float) -> None:
        """The stream is gone: reopen it (at once the first time), keeping the session for now."""
        self._close_channel()
        self._problem = reason
        if self.state == UP:
            self.state, self._trouble_since = RECONNECTING, now
            self._retry_at = now
            log.warning("%s -> %s at %s: %s; reconnecting", self.name, self.peer, self.address, reason)
        else:
            self._tell(reason)
            self._retry_at, self._retry_s = now + self._retry_s, min(self._retry_s * 2, self.pacing.max_retry_s)

    def _has_room(self) -> bool:
        return self.pacing.in_flight is None or len(self._unanswered) < self.pacing.in_flight

    def _new_session(self) -> None:
        self.epoch = secrets.token_hex(8)
        self._numbers = itertools.count(1)
        self._unanswered.clear()
        self._pending.clear()

    def _live_channel(self) -> Channel:
        """The open stream: set by _connect until _close_channel; the session is up only while it is."""
        if self._channel is None:
            raise RuntimeError(f"{self.name} -> {self.peer}: no open stream to send on (state {self.state})")
        return self._channel

    def _close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel, self._hello_sent_at = None, None

    def _tell(self, problem: str) -> None:
        if problem != self._told:
            log.warning("%s -> %s at %s: %s", self.name, self.peer, self.address, problem)
            self._told = problem
