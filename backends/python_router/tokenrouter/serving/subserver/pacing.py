"""How the response writer paces each stream: what it holds between rounds, and when it lets it go.

Every response costs the same however many tokens it carries (a send over the stub's IPC, the
front's detokenizing and its own response, a gRPC message, a client callback), and a hop behind the
writer can fall behind without the writer noticing (the front's stub queues for it). So the writer
paces each stream instead: a request's responses are at least (live streams / max_responses_per_s)
apart, and tokens produced in between leave together in the next one, each with its model and in
its place (``Pacer``). The first token and the final response are never held, so first-token
latency stays; with few streams the interval is below a step and every token still leaves alone.
Like vLLM's and TensorRT-LLM's ``stream_interval``, but in time and only as many streams need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ..triton_api import ResponseSender
from .output_chunk import OutputChunk


@dataclass
class QueuedChunk:
    """Output queued for a request's sender."""

    rid: str
    sender: ResponseSender
    chunk: OutputChunk
    wanted: frozenset[str] | None = None  # the outputs the caller asked for (None: all)
    alone: bool = False  # its own response, at once: one token per response, as TensorRT-LLM streams

    @property
    def final(self) -> bool:
        return self.chunk.final


@dataclass
class QueuedError:
    """The error that ends a request, queued for its sender."""

    rid: str
    sender: ResponseSender
    message: str
    code: int | None = None  # a TritonError code; None: Triton's default (INTERNAL)
    in_band: bool = False  # a front's request: the error goes as data (error_codes.py)
    final = True


QueuedItem = Union[QueuedChunk, QueuedError]


class Pacer:
    """What the writer holds between rounds: per request, the output not sent yet and when its last
    response went out. A request's first response and its final one go out at once; between them,
    its responses are at least ``interval`` apart, and what it produces meanwhile merges into the
    held chunk (every token in order, with its model). Used by the writer thread only."""

    def __init__(self) -> None:
        self._held: dict[str, QueuedChunk] = {}
        self._last: dict[str, float] = {}  # rid -> when its last response went out

    def add(self, item: QueuedItem) -> list[QueuedItem]:
        """Take one queued item; returns what must go out now, in this order, whatever the pacing:
        an error (after the output held before it), or a final chunk that a later one cannot join."""
        held = self._held.get(item.rid)
        if isinstance(item, QueuedError):
            self._held.pop(item.rid, None)
            self._last.pop(item.rid, None)
            return [held, item] if held is not None else [item]
        if item.alone:  # its pacing is off: nothing of it is ever held
            return [held, item] if held is not None else [item]
        if held is None or held.final:
            self._held[item.rid] = item
            return [held] if held is not None else []
        held.chunk.absorb(item.chunk)
        return []

    def due(self, now: float, interval: float) -> list[QueuedChunk]:
        """The held chunks whose time has come: first and final ones always."""
        out = []
        for rid, item in list(self._held.items()):
            last = self._last.get(rid)
            if item.final or last is None or now - last >= interval:
                out.append(item)
                del self._held[rid]
                if item.final:
                    self._last.pop(rid, None)
                else:
                    self._last[rid] = now
        return out

    def next_due(self, now: float, interval: float) -> float | None:
        """Seconds until the earliest held chunk is due; None when nothing is held."""
        waits = [max(0.0, self._last.get(rid, now - interval) + interval - now) for rid in self._held]
        return min(waits) if waits else None
