"""Choices as they come from the fronts: text pieces, log probabilities, a truthful finish reason.

Each choice is one front call (translate.py). ``ChoiceRun`` turns its responses into OpenAI
pieces, cutting the text at a stop string (stops.py) and ending the call there; ``merged`` runs
several choices at once and yields their pieces as they come. Leaving either early (a client that
went away, an error) ends every call still running, which cancels its request on every model.
"""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import AsyncGenerator, Sequence

from .errors import OpenAIError, from_triton
from .stops import StopText
from .translate import Choice
from .triton_stream import TritonCallError, TritonChannel

# the fronts' finish reasons -> OpenAI's; "eos" and a stop word are both OpenAI's natural "stop"
FINISH = {"length": "length", "stop": "stop", "eos": "stop"}


@dataclass
class Piece:
    """What one front response added to a choice."""

    index: int
    text: str
    finish_reason: str | None  # set on the choice's last piece
    large_share: float  # of the choice's output so far
    token_ids: list[int] = field(default_factory=list)  # with log probabilities only
    log_probs: list[float] = field(default_factory=list)


class ChoiceRun:
    def __init__(self, channel: TritonChannel, model: str, choice: Choice, stops: list[str],
                 params: dict[str, str]) -> None:
        self._channel, self._model, self.choice, self._params = channel, model, choice, params
        self._stop = StopText(stops)
        self.prompt_tokens = 0
        self.completion_tokens = 0  # generated, a stop string's tokens included

    async def pieces(self) -> AsyncGenerator[Piece, None]:
        choice = self.choice
        try:
            # aclosing: leaving the loop must end the call now, not when the generator is collected
            async with aclosing(self._channel.generate(self._model, choice.inputs, choice.outputs)) as replies:
                async for reply in replies:
                    self.prompt_tokens = reply.prompt_tokens or self.prompt_tokens
                    self.completion_tokens += reply.tokens
                    last = reply.final or bool(reply.finish_reason)
                    text = self._stop.feed(reply.text, last)
                    finish = "stop" if self._stop.stopped else (self._finish(reply.finish_reason) if last else None)
                    piece = Piece(choice.index, text, finish, reply.large_share)
                    if reply.log_probs is not None:
                        if reply.token_ids is None:  # the front sends both or neither
                            raise RuntimeError(f"front {self._model} sent output_log_probs without output_ids")
                        piece.token_ids, piece.log_probs = reply.token_ids.tolist(), reply.log_probs.tolist()
                    yield piece
                    if finish is not None:
                        return  # after a stop string: the call ends here, cancelling what the front still does
        except TritonCallError as failed:
            raise from_triton(failed, self._params) from None

    @staticmethod
    def _finish(reason: str) -> str:
        if reason not in FINISH:  # "cancelled": the server ended it (a shutdown), not this client
            raise OpenAIError(503, f"the generation ended early ({reason or 'no reason'}); try again",
                              type="server_error", code="server_unavailable")
        return FINISH[reason]


async def merged(runs: Sequence[ChoiceRun]) -> AsyncGenerator[Piece, None]:
    """Every run's pieces as they come; the first error ends them all and is raised."""
    if len(runs) == 1:  # the common case, without a task per choice
        async with aclosing(runs[0].pieces()) as pieces:
            async for piece in pieces:
                yield piece
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(run: ChoiceRun) -> None:
        try:
            async with aclosing(run.pieces()) as pieces:
                async for piece in pieces:
                    await queue.put(piece)
            await queue.put(done)
        except Exception as failed:  # noqa: BLE001 - handed to the consumer, which raises it
            await queue.put(failed)

    tasks = [asyncio.create_task(pump(run)) for run in runs]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is done:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def usage(runs: Sequence[ChoiceRun], n: int) -> dict[str, int]:
    """Tokens as the server's tokenizer counted them: each prompt once (choices p*n .. p*n+n-1
    share prompt p), every choice's output."""
    prompt = sum(run.prompt_tokens for run in runs if run.choice.index % n == 0)
    completion = sum(run.completion_tokens for run in runs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
