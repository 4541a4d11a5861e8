"""Admission at the entry: a FIFO of submissions, at most ``max_active`` at once, and KV reserved
for prompt + ``max_tokens`` on every model before a request starts, so a routed request never runs
out of KV anywhere (it only waits here for finished requests to free some)."""

from __future__ import annotations

from collections import deque

from .request import RequestError, Submission


class Admission:
    def __init__(self, capacities: dict[str, tuple[int, int]], max_active: int) -> None:
        """``capacities``: model -> (total KV blocks, block size)."""
        self.capacities = dict(capacities)
        self.max_active = max_active
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

    def can_admit(self, active: int) -> bool:
        return bool(self.waiting) and active < self.max_active

    def admit_next(self, active: int) -> Submission | None:
        """The head of the queue with its KV reserved, or None (queue empty, ``max_active``
        reached, or not enough unreserved KV on some model: FIFO, so later ones wait too)."""
        if not self.can_admit(active):
            return None
        head = self.waiting[0]
        need = self.blocks_needed(len(head.prompt_ids) + head.spec.max_tokens)
        if any(self.reserved[m] + blocks > self.capacities[m][0] for m, blocks in need.items()):
            return None
        self.waiting.popleft()
        for model, blocks in need.items():
            self.reserved[model] += blocks
        self._reservations[head.rid] = need
        return head

    def unreserve(self, rid: str) -> None:
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
