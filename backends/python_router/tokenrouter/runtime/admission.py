"""Admission at the entry: a bounded queue of submissions, at most ``max_active`` at once, and KV
reserved for prompt + ``max_tokens`` on every model before a request starts, so a routed request
never runs out of KV anywhere (it only waits here for finished requests to free some).

The queue is steerable: it holds at most ``max_queue`` submissions (one more is refused at once
with ``ServerBusy``); a submission waiting longer than ``queue_timeout_s`` is taken out to end
with an error; and admission is fit-first without starvation: when a waiting request's KV does
not fit yet, a later one whose KV fits may start ahead of it, but only ``max_bypass`` times.
After that nothing passes it, so the KV that finishing requests free goes to it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import islice

from ..request_builder import RequestError
from .request import Submission


class ServerBusy(RuntimeError):
    """The admission queue is full: the request was refused at once and took nothing (retry later).
    Not a ``RequestError``: nothing is wrong with the request itself."""


@dataclass(frozen=True, kw_only=True)
class QueueLimits:
    max_active: int  # requests active at once
    max_queue: int  # submissions waiting for admission at once
    queue_timeout_s: float  # longest a submission waits for admission (0: no limit)
    max_bypass: int  # later requests that may be admitted ahead of a waiting one (0: strict FIFO)


class Admission:
    def __init__(self, capacities: dict[str, tuple[int, int]], limits: QueueLimits) -> None:
        """``capacities``: model -> (total KV blocks, block size)."""
        self.capacities = dict(capacities)
        self.limits = limits
        self.waiting: deque[Submission] = deque()
        self.reserved = {model: 0 for model in self.capacities}  # blocks per model
        self._reservations: dict[str, dict[str, int]] = {}  # rid -> blocks per model

    def blocks_needed(self, tokens: int) -> dict[str, int]:
        return {model: -(-tokens // block_size) for model, (_, block_size) in self.capacities.items()}

    def check_fits(self, prompt_len: int, max_tokens: int) -> None:
        """Refuse at once a request that could never be admitted (more KV than a whole pool)."""
        need = prompt_len + max_tokens
        for model, blocks in self.blocks_needed(need).items():
            total, block_size = self.capacities[model]
            if blocks > total:
                raise RequestError(f"the request needs {need} tokens of KV but model '{model}' holds "
                                   f"{total * block_size} in all")

    def check_room(self, in_transit: int = 0) -> None:
        """Raise ServerBusy when the queue (plus ``in_transit`` submissions accepted but not yet
        queued) is full. Reads only the queue's length, so another thread may call it while it
        keeps the count of what it has in transit consistent (``Subserver.submit`` does)."""
        queued = len(self.waiting) + in_transit
        if queued >= self.limits.max_queue:
            raise ServerBusy(f"server busy: {queued} requests queued (max_queue {self.limits.max_queue}); retry later")

    def can_admit(self, active: int) -> bool:
        return bool(self.waiting) and active < self.limits.max_active

    def admit_next(self, active: int) -> Submission | None:
        """The first waiting submission whose KV fits, with its KV reserved; or None (queue empty,
        ``max_active`` reached, or nothing fits before a submission already passed ``max_bypass``
        times). Every submission passed over counts one more bypass."""
        if not self.can_admit(active):
            return None
        for position, submission in enumerate(self.waiting):
            need = self.blocks_needed(len(submission.prompt_ids) + submission.spec.max_tokens)
            if all(self.reserved[m] + blocks <= self.capacities[m][0] for m, blocks in need.items()):
                del self.waiting[position]
                for passed in islice(self.waiting, position):
                    passed.bypassed += 1
                for model, blocks in need.items():
                    self.reserved[model] += blocks
                self._reservations[submission.rid] = need
                return submission
            if submission.bypassed >= self.limits.max_bypass:
                return None  # its turn: the KV that frees up next is for it
        return None

    def expire(self, now: float) -> list[Submission]:
        """Take out the submissions that waited longer than ``queue_timeout_s`` (they hold no KV).
        The queue is in arrival order, so the expired ones are at its front."""
        timeout = self.limits.queue_timeout_s
        expired: list[Submission] = []
        while timeout > 0 and self.waiting and now - self.waiting[0].submitted_at > timeout:
            expired.append(self.waiting.popleft())
        return expired

    def release(self, rid: str) -> None:
        """Give back the KV an admitted request reserved (it ended)."""
        for model, blocks in self._reservations.pop(rid, {}).items():
            self.reserved[model] -= blocks

    def withdraw(self, rid: str) -> Submission | None:
        """Take a still-waiting submission out of the queue (cancel before admission)."""
        for submission in self.waiting:
            if submission.rid == rid:
                self.waiting.remove(submission)
                return submission
        return None

    def drain(self) -> list[Submission]:
        waiting, self.waiting = list(self.waiting), deque()
        return waiting
