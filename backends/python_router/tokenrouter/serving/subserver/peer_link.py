"""One direction of a peer pair across Triton servers: this subserver's messages to a subserver on
another server, over one persistent stream (grpc_channel.py: Triton's ModelStreamInfer into the
peer's model). peer_sessions.py is the other end.

- **Never blocks the decoding loop**: ``send`` only queues; one thread per link encodes and ships.
  Everything queued when it wakes (a step's messages to this peer, or several steps') goes in one
  call, without waiting for the answer to the one before.
- **Numbered and answered**: a session (random *epoch*) opens with a hello carrying this node's view
  of the deployment, and numbers its batches; the peer answers each. Unanswered batches are kept.
- **Reconnects**: a broken stream is reopened at once, then with a growing delay; on the same
  session every unanswered batch is sent again, in order (the peer applies each exactly once).
- **Gives up in bounded time**: when the peer answers nothing for ``down_after_s`` (its server died,
  the network dropped), the session is lost: ``on_down`` (the requests away at the peer end with an
  error), a new session is tried until the peer is back (``on_up``). Meanwhile a handoff to it
  raises ``PeerUnreachable`` at once, and other messages (release, active) are dropped: the peer's
  end gives up the lost session's requests by itself.
- A heartbeat (an empty batch) goes out when nothing else did for a quarter of ``down_after_s``.
- ``delay_s`` holds every batch that long before it is sent (measurements: a network's latency).
"""

from __future__ import annotations

import itertools
import json
import logging
import queue
import secrets
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from ...protocol import PeerMessage, encode_batch
from ...runtime.transport import PeerUnreachable
from ..pair_secret import pair_parameters
from .peer_sessions import HELLO_PARAMETER, LINK_PARAMETER, link_parameter

log = logging.getLogger(__name__)

CONNECTING, UP, RECONNECTING = "connecting", "up", "reconnecting"
FIRST_RETRY_S, MAX_RETRY_S = 0.05, 2.0


class Channel(Protocol):
    """One open stream to the peer's server."""

    def send(self, number: int, payload: bytes, parameters: dict[str, str]) -> None: ...

    def close(self) -> None: ...


# open_channel(on_answer(number or None, error or None), on_broken(reason)) -> Channel. Both callbacks
# may run on any thread; a refusal of a call whose number the server did not echo comes as None.
OpenChannel = Callable[[Callable[[int | None, str | None], None], Callable[[str], None]], Channel]


@dataclass
class _Sent:
    payload: bytes
    sent_at: float


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
                 on_failure: Callable[[str, str], None],
                 on_round_trip: Callable[[float], None] | None = None) -> None:
        """``on_down(peer, error)``: the session is lost, end what was away at the peer;
        ``on_failure(rid, error)``: a handoff that could not go out; ``on_up(peer)``: connected."""
        self.name, self.peer, self.address = name, peer, address
        self._open = open_channel
        self._secret_parameters = pair_parameters(secret)
        self._hello = json.dumps(view, sort_keys=True)
        self._down_after_s, self._delay_s = down_after_s, delay_s
        self._heartbeat_s = down_after_s / 4
        self._on_up, self._on_down, self._on_failure = on_up, on_down, on_failure
        self._on_round_trip = on_round_trip
        self._events: queue.Queue[_Event] = queue.Queue()
        # written by the link thread only; send() reads them from the decoding loop's thread
        self.state = CONNECTING
        self._epoch = ""
        self._problem = "not connected yet"
        # the link thread's own
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
        self._closed = False
        self._new_session()
        self._thread = threading.Thread(target=self._run, name=f"link-to-{peer}", daemon=True)
        self._thread.start()

    # --- any thread -------------------------------------------------------------------------------------
    @property
    def problem(self) -> str | None:
        """Why the peer cannot take messages now (None: it can)."""
        if self.state == CONNECTING:
            return f"model '{self.peer}' at {self.address} is not connected: {self._problem}"
        return None

    def send(self, messages: Sequence[PeerMessage]) -> None:
        epoch = self._epoch
        if self.state == CONNECTING:
            if any(m.kind == "handoff" for m in messages):
                raise PeerUnreachable(self.problem or "reconnected meanwhile; try again")
            return
        self._events.put(_Queued(epoch, time.monotonic() + self._delay_s, list(messages)))

    def close(self) -> None:
        self._closed = True
        self._events.put(_Close())
        self._thread.join(timeout=5)

    # --- the link's thread --------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._closed:
            try:
                event = self._events.get(timeout=max(0.0, self._next_wakeup() - time.monotonic()))
            except queue.Empty:
                event = None
            try:
                while event is not None:
                    self._handle(event)
                    event = self._events.get_nowait()
            except queue.Empty:
                pass
            try:
                self._tick(time.monotonic())
            except Exception:  # noqa: BLE001 - a bug must not end the link: the peer would hang
                log.exception("%s -> %s: link step failed", self.name, self.peer)
                self._lose("internal error in the link (see the log)", time.monotonic())
        if self._channel is not None:
            self._channel.close()

    def _handle(self, event: _Event) -> None:
        now = time.monotonic()
        match event:
            case _Queued(epoch, due, messages):
                if epoch != self._epoch or self.state == CONNECTING:
                    self._fail_handoffs(messages, self.problem or "the session to it was lost")
                else:
                    self._pending.append((due, messages))
            case _Answered(epoch, number, error):
                if epoch == self._epoch:
                    self._on_answer(number, error, now)
            case _Broken(channel, reason):
                if channel == self._channel_id and self._channel is not None:
                    self._drop_channel(f"the stream broke ({reason})", now)
            case _Close():
                pass  # ``closed`` is set: the loop ends after this round

    def _on_answer(self, number: int | None, error: str | None, now: float) -> None:
        hello_outstanding = self._hello_sent_at is not None
        if error is not None:
            if hello_outstanding and number in (0, None):  # the peer refused this session
                self._tell(f"refused by {self.address}: {error}")
                if self.state == RECONNECTING:
                    self._lose(f"refused by {self.address}: {error}", now)
                else:
                    self._problem = f"refused by {self.address}: {error}"
                    self._close_channel()
                    self._retry_at = now + MAX_RETRY_S
            else:
                self._lose(f"it refused a batch: {error}", now)
            return
        if number == 0:
            if hello_outstanding:  # (a late answer to an earlier stream's hello changes nothing)
                self._connected(now)
        elif number is not None and (sent := self._unanswered.pop(number, None)) is not None \
                and self._on_round_trip is not None:
            self._on_round_trip(now - sent.sent_at)

    def _tick(self, now: float) -> None:
        if self.state == UP:
            oldest = next(iter(self._unanswered.values()), None)
            if oldest is not None and now - oldest.sent_at > self._down_after_s:
                self._lose(f"no answer for {self._down_after_s:g} s", now)
                return
            if self._pending and self._pending[0][0] <= now:
                self._ship(now)
            elif now - self._last_sent >= self._heartbeat_s:
                self._ship(now, heartbeat=True)
            return
        if self.state == RECONNECTING and now - self._trouble_since > self._down_after_s:
            self._lose(f"{self._problem}, and no new stream within {self._down_after_s:g} s", now)
        if self._hello_sent_at is not None and now - self._hello_sent_at > self._down_after_s:
            self._drop_channel(f"no answer to the hello within {self._down_after_s:g} s", now)
        if self._channel is None and now >= self._retry_at:
            self._connect(now)

    def _next_wakeup(self) -> float:
        if self.state == UP:
            times = [self._last_sent + self._heartbeat_s]
            if self._pending:
                times.append(self._pending[0][0])
            if self._unanswered:
                times.append(next(iter(self._unanswered.values())).sent_at + self._down_after_s)
            return min(times)
        times = [self._retry_at if self._channel is None else time.monotonic() + 0.05]
        if self.state == RECONNECTING:
            times.append(self._trouble_since + self._down_after_s)
        return min(times)

    def _connect(self, now: float) -> None:
        epoch, channel = self._epoch, next(self._channels)
        try:
            self._channel = self._open(lambda number, error: self._events.put(_Answered(epoch, number, error)),
                                       lambda reason: self._events.put(_Broken(channel, reason)))
        except Exception as exc:  # noqa: BLE001 - e.g. unreadable TLS files: said, and tried again
            self._problem = f"cannot open a stream: {type(exc).__name__}: {exc}"
            self._tell(self._problem)
            self._retry_at, self._retry_s = now + self._retry_s, min(self._retry_s * 2, MAX_RETRY_S)
            return
        self._channel_id = channel
        self._hello_sent_at = now
        self._channel.send(0, b"[]", {**self._secret_parameters, LINK_PARAMETER: link_parameter(self.name, epoch, 0),
                                      HELLO_PARAMETER: self._hello})

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
            log.info("%s -> %s at %s: reconnected, %d batch(es) sent again", self.name, self.peer, self.address,
                     len(self._unanswered))

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
        return {**self._secret_parameters, LINK_PARAMETER: link_parameter(self.name, self._epoch, number)}

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
            self._retry_at, self._retry_s = now + self._retry_s, min(self._retry_s * 2, MAX_RETRY_S)

    def _lose(self, reason: str, now: float) -> None:
        """Give the session up: what it carried is lost on both ends; a new one starts when the peer answers."""
        was = self.state
        self._close_channel()
        self._problem = reason
        self.state = CONNECTING
        for _, messages in self._pending:
            self._fail_handoffs(messages, reason)
        self._new_session()
        self._retry_at = now + self._retry_s
        if was != CONNECTING:
            log.error("%s -> %s at %s: lost (%s)", self.name, self.peer, self.address, reason)
            self._on_down(self.peer, f"model '{self.peer}' at {self.address} is unreachable: {reason}")

    def _new_session(self) -> None:
        self._epoch = secrets.token_hex(8)
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

    def _fail_handoffs(self, messages: list[PeerMessage], reason: str) -> None:
        for message in messages:
            if message.kind == "handoff":
                self._on_failure(message.rid, f"could not reach model '{self.peer}' at {self.address}: {reason}")

    def _tell(self, problem: str) -> None:
        if problem != self._told:
            log.warning("%s -> %s at %s: %s", self.name, self.peer, self.address, problem)
            self._told = problem
