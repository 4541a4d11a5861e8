"""One request's output as it comes, read by its Dynamo ``generate`` on the event loop: what came since
the last read, and how it ended. A replica's worker fills it from its pair's process (pair_process.py),
the split pair's entry from its subserver's loop (entry_engine.py); both add on the event loop."""

from __future__ import annotations

import asyncio


class StreamedOutput:
    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.origins: list[int] = []
        self.logprobs: list[float] | None = None
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.changed = asyncio.Event()  # something to read
        self.ended = asyncio.Event()  # nothing more will come

    def add(self, tokens: list[int], origins: list[int], logprobs: list[float] | None, finish_reason: str | None,
            error: str | None) -> None:
        self.tokens += tokens
        self.origins += origins
        if logprobs is not None:
            self.logprobs = (self.logprobs or []) + logprobs
        if finish_reason is not None:
            self.finish_reason, self.error = finish_reason, error
            self.ended.set()
        self.changed.set()

    def take(self) -> tuple[list[int], list[int], list[float] | None]:
        """What came since the last take."""
        taken = self.tokens, self.origins, self.logprobs
        self.tokens, self.origins, self.logprobs = [], [], None if self.logprobs is None else []
        return taken
