"""The requests a subserver's response writer answers until their final response, and the keys
fronts named them by.

A front names each request it sends the entry by a key (with the server's secret) and cancels it
by that key: Triton does not pass a client's cancellation on to a BLS request (intake.py). So a
keyed request is a front's: its errors go as data (error_codes.py), and its sender is not polled
for cancellation (its front polls its client). Used from the intake's and the writer's threads.
"""

from __future__ import annotations

import threading

from ..triton_api import ResponseSender


class TrackedRequests:
    """rid -> the sender that answers it, and each front's key <-> its rid."""

    def __init__(self) -> None:
        self._senders: dict[str, ResponseSender] = {}
        self._keys: dict[str, str] = {}  # request key (chosen by a front, see front_model.py) -> rid
        self._key_of: dict[str, str] = {}  # rid -> its key
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._senders)

    def track(self, rid: str, sender: ResponseSender, key: str | None = None) -> None:
        with self._lock:
            self._senders[rid] = sender
            if key is not None:
                self._keys[key], self._key_of[rid] = rid, key

    def untrack(self, rid: str) -> None:
        with self._lock:
            self._senders.pop(rid, None)
            self._keys.pop(self._key_of.pop(rid, ""), None)

    def rids_of(self, keys: list[str]) -> list[str]:
        """The live requests that fronts named ``keys`` (unknown or finished ones are skipped)."""
        with self._lock:
            return [self._keys[key] for key in keys if key in self._keys]

    def is_keyed(self, rid: str) -> bool:
        """Whether a front named ``rid``."""
        with self._lock:
            return rid in self._key_of

    def live(self) -> list[tuple[str, ResponseSender]]:
        """(rid, sender) of every request whose final response is still to come."""
        with self._lock:
            return list(self._senders.items())

    def polled(self) -> list[tuple[str, ResponseSender]]:
        """(rid, sender) of the requests whose clients call this model directly (not keyed)."""
        with self._lock:
            return [(rid, sender) for rid, sender in self._senders.items() if rid not in self._key_of]

    def polled_count(self) -> int:
        """How many ``polled`` returns, read without the lock (it only sizes the poll interval)."""
        return len(self._senders) - len(self._key_of)
