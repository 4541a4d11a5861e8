"""Peer messages between subservers in one Triton server, by BLS.

One sender thread per peer drains its queue and ships everything queued as one BLS request
(``peer_message``), so the decoding loop never waits on Triton and a burst of handoffs costs one
round trip. A step's messages to a peer are queued as one item: a sender that woke on the first of
them would otherwise ship it alone. Every call carries this server start's secret (peer_auth.py).
Calls are blocking ``exec`` from that thread: never from an event loop, never concurrent
``async_exec(decoupled=True)`` (see notes/triton.md).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable, Sequence

from ...protocol import PeerMessage, encode_batch
from ...runtime.transport import Transport
from ..peer_auth import peer_parameters
from ..schema import PEER_INPUT, SUBSERVER_INPUTS

log = logging.getLogger(__name__)


class BlsTransport(Transport):
    def __init__(self, pb_utils: Any, secret: str, *, on_failure: Callable[[str, str], None],
                 on_round_trip: Callable[[float], None] | None = None) -> None:
        """``secret``: this server start's peer secret; peers refuse messages without it.
        ``on_failure(rid, error)`` is called for every request whose message could not be delivered,
        so it ends with an error instead of waiting forever for a peer that never heard of it."""
        self._pb = pb_utils
        self._parameters = peer_parameters(secret)
        self._on_failure = on_failure
        self._on_round_trip = on_round_trip
        self._queues: dict[str, queue.Queue] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    def send(self, peer: str, messages: Sequence[PeerMessage]) -> None:
        self._queue_for(peer).put(list(messages))

    def close(self) -> None:
        self._closed = True
        for q in self._queues.values():
            q.put(None)
        for thread in self._threads:
            thread.join(timeout=5)

    def _queue_for(self, peer: str) -> queue.Queue:
        with self._lock:
            if peer not in self._queues:
                self._queues[peer] = queue.Queue()
                thread = threading.Thread(target=self._pump, args=(peer, self._queues[peer]),
                                          name=f"bls-to-{peer}", daemon=True)
                self._threads.append(thread)
                thread.start()
            return self._queues[peer]

    def _pump(self, peer: str, outbox: queue.Queue) -> None:
        while True:
            first = outbox.get()
            if first is None:
                return
            batch = list(first)
            while True:
                try:
                    item = outbox.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._ship(peer, batch)
                    return
                batch += item
            self._ship(peer, batch)

    def _ship(self, peer: str, messages: list[PeerMessage]) -> None:
        payload = SUBSERVER_INPUTS[PEER_INPUT].row(encode_batch(messages))  # the peers' batch dim: one row
        request = self._pb.InferenceRequest(model_name=peer, requested_output_names=[],
                                            inputs=[self._pb.Tensor(PEER_INPUT, payload)],
                                            parameters=self._parameters)
        start = time.monotonic()
        error = None
        try:
            for response in request.exec(decoupled=True):
                if response.has_error():
                    error = response.error().message()
        except Exception as exc:  # the peer model is unloaded, crashed, or the server is stopping
            error = f"{type(exc).__name__}: {exc}"
        if error is not None:
            log.error("peer %s did not take %d message(s): %s", peer, len(messages), error)
            for rid in {m.rid for m in messages if m.rid}:
                self._on_failure(rid, f"could not reach model '{peer}': {error}")
            return
        if self._on_round_trip is not None:
            try:
                self._on_round_trip(time.monotonic() - start)
            except Exception:  # metrics must never stop the sender thread
                log.exception("recording the peer round trip failed")
