"""A client sink for tests that drive real subserver loops: collects the tokens and says when the
request ended (``done``, set by the call that carries the finish)."""

from __future__ import annotations

import threading


class DoneSink:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.tokens: list[int] = []
        self.finish = self.error = None

    def on_output(self, tokens, origins, finish_reason=None, error=None, logprobs=None) -> None:
        self.tokens += tokens
        if finish_reason is not None:
            self.finish, self.error = finish_reason, error
            self.done.set()
