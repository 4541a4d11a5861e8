"""The runtime's sink for one request on a subserver: its output events -> chunks for the response writer."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Collection

from ...runtime.emission import large_model_share
from ..schema import PREFIX_TOKENS
from ..triton_api import ResponseSender
from .output_chunk import OutputChunk

if TYPE_CHECKING:
    from .subserver_writer import SubserverWriter


class TritonSink:
    """A request's output as decoupled responses: chunks as they come when streaming, else one at the end."""

    def __init__(self, writer: "SubserverWriter", rid: str, sender: ResponseSender, stream: bool, names: list[str],
                 entry_index: int, wanted: Collection[str] | None = None, one_token: bool = False) -> None:
        """``wanted``: the outputs the caller asked for (None: all); ``one_token``: when streaming, each
        token its own response, never merged by the writer's pacing (TensorRT-LLM's streaming)."""
        self._writer, self._rid, self._sender, self._stream = writer, rid, sender, stream
        self._one_token = one_token and stream
        self._wanted = None if wanted is None else frozenset(wanted)
        self._names = [name.encode() for name in names]
        self._entry_index = entry_index
        self._tail: list[int] = []  # the last PREFIX_TOKENS tokens handed to the writer
        self._unsent: OutputChunk | None = None  # not streaming: everything so far
        self._by_model: Counter = Counter()

    def on_output(self, tokens: list[int], origins: list[int], finish_reason: str | None = None,
                  error: str | None = None, logprobs: list[float] | None = None) -> None:
        if finish_reason == "error":
            self._writer.error(self._rid, self._sender, error or "generation failed")
            return
        if self._one_token and len(tokens) > 1:  # a peer's run of tokens, returned at once
            for i, (token, origin) in enumerate(zip(tokens, origins)):
                self._output([token], [origin], finish_reason if i == len(tokens) - 1 else None,
                             None if logprobs is None else logprobs[i:i + 1])
            return
        self._output(tokens, origins, finish_reason, logprobs)

    def _output(self, tokens: list[int], origins: list[int], finish_reason: str | None,
                logprobs: list[float] | None) -> None:
        self._by_model.update(origins)
        chunk = OutputChunk(list(tokens), [self._names[o] for o in origins], self._tail, finish_reason,
                      large_model_share(self._by_model, self._entry_index), list(logprobs or ()))
        self._tail = (self._tail + chunk.tokens)[-PREFIX_TOKENS:]
        if not self._stream:
            if self._unsent is None:
                self._unsent = chunk
            else:
                self._unsent.absorb(chunk)
            if finish_reason is None:
                return
            chunk = self._unsent
        self._writer.respond(self._rid, self._sender, chunk, self._wanted, alone=self._one_token)
