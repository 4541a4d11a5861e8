"""The system under test, as the load generator sees it: submit a prompt, get token arrivals.

A target runs one request per call to ``generate`` (the calling client thread waits for it) and
may cut a request that is still running at ``deadline`` (the end of the measurement window), so
a run does not wait for stragglers.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Callable, Generic, Protocol, TypeVar

from tokenrouter.runtime.api import GenerationResult, TokenRouter
from tokenrouter.request_builder import RequestError

from .records import Prompt, RequestRecord

Spans = dict[str, list[tuple[float, float]]]


class _Closes(Protocol):
    def close(self) -> None: ...


Closable = TypeVar("Closable", bound=_Closes)
STEP_LOG = 100_000  # step records kept per subserver of an embedded target (for step_spans)


def time_left(deadline: float) -> float | None:
    """Seconds until ``deadline`` as a wait timeout (None: no deadline)."""
    return None if math.isinf(deadline) else max(0.0, deadline - time.monotonic())


class Target(Protocol):
    large: str  # the model whose token share is reported

    def generate(self, prompt: Prompt, *, max_tokens: int, seed: int, deadline: float) -> RequestRecord: ...

    def step_spans(self) -> Spans:
        """Engine steps per model as (start, end) on the monotonic clock; {} when not observable."""
        ...

    def close(self) -> None: ...


class PerThread(Generic[Closable]):
    """One of something per client thread (a gRPC stream, an HTTP connection), kept open for the
    thread's requests one after another, as a streaming client keeps it; all closed at the end."""

    def __init__(self, make: Callable[[], Closable]) -> None:
        self._make, self._local, self._lock = make, threading.local(), threading.Lock()
        self._made: list[Closable] = []

    def get(self) -> Closable:
        made = getattr(self._local, "made", None)
        if made is None:
            made = self._local.made = self._make()
            with self._lock:
                self._made.append(made)
        return made

    def close(self) -> None:
        with self._lock:
            made, self._made = self._made, []
        for thing in made:
            thing.close()


def _output(prompt: Prompt, result: GenerationResult) -> Prompt:
    """The text for a text prompt, else the token ids."""
    if not isinstance(prompt, str):
        return result.token_ids
    if result.text is None:  # submit refuses text when the engine has no tokenizer: not reached
        raise RuntimeError("the embedded engine returned no text for a text prompt")
    return result.text


class EmbeddedTarget:
    """The embedded Python API (TokenRouter.submit); tokens are stamped when the entry
    subserver hands them to the request's handle."""

    def __init__(self, engine: TokenRouter, large: str) -> None:
        self.engine, self.large = engine, large

    def generate(self, prompt: Prompt, *, max_tokens: int, seed: int, deadline: float) -> RequestRecord:
        record = RequestRecord()
        try:
            handle = self.engine.submit(prompt, max_tokens=max_tokens, seed=seed)
        except RequestError as exc:  # e.g. a conversation that outgrew the context: counted as an error
            record.finish("error", [], str(exc))
            return record
        # The listener runs on the entry subserver's loop thread, inside the system under test:
        # it only notes (time, tokens so far); the record is built here afterwards.
        stamps: list[tuple[float, int]] = []

        def stamp() -> None:
            stamps.append((time.monotonic(), len(handle.origins)))

        handle.add_listener(stamp)
        stamp()  # tokens may have arrived before the listener was added
        try:
            result = handle.wait(time_left(deadline))
        except TimeoutError:
            handle.cancel()
            result = handle.wait()
        stamp()
        counted = 0
        for at, total in sorted(stamps):
            record.add(total - counted, at=at)
            counted = max(counted, total)
        record.tokens_by_model.update(result.models)
        record.finish(result.finish_reason, _output(prompt, result), result.error)
        return record

    def step_spans(self) -> Spans:
        return {name: [(r.start, r.end) for r in server.step_log]
                for name, server in self.engine.subservers.items() if server.step_log is not None}

    def close(self) -> None:
        self.engine.shutdown()
