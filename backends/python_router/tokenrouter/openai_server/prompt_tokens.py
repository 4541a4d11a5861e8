"""A chat prompt's tokens, counted without stalling the server's event loop.

A chat without ``max_tokens`` gets as many as the context holds, which needs the rendered prompt's
token count. Tokenizing 1 MB takes seconds, and on the event loop that stalled every client of the
server for as long (eight such chats: 13 s). So the caps come first and the work goes elsewhere:
a prompt over the fronts' byte cap cannot fit the context (no token of a byte-level vocabulary is
that long) and is refused without tokenizing; a short prompt is counted in place (milliseconds,
less than a hand-off costs); a long one by a bounded pool of worker threads with their own copy of
the tokenizer (HF's tokenizers release the GIL while they encode, so the loop keeps running).
"""

from __future__ import annotations

import asyncio
import copy
import threading
from concurrent.futures import ThreadPoolExecutor

from ..text import TextCodec
from .errors import bad_request

INLINE_BYTES = 4096  # at most about a millisecond of tokenizing: counted on the event loop


class PromptCounter:
    def __init__(self, codec: TextCodec, max_bytes: int, workers: int) -> None:
        self._codec, self.max_bytes = codec, max_bytes
        self._local = threading.local()  # each worker's own tokenizer: none is shared across threads
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="prompt-tokens")

    async def count(self, prompt: str, param: str) -> int:
        """The prompt's tokens as the fronts count them (text as it is, no chat template)."""
        size = len(prompt.encode("utf-8"))
        if size > self.max_bytes:
            raise bad_request(f"{param}: the prompt is {size} bytes; the limit is {self.max_bytes} (the context "
                              "holds fewer tokens)", param=param, code="context_length_exceeded")
        if size <= INLINE_BYTES:
            return len(self._codec.encode_prompt(prompt, chat_template=False))
        # cancelled (the client left) before a worker took it: it never runs
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._count_in_worker, prompt)

    def _count_in_worker(self, prompt: str) -> int:
        codec = getattr(self._local, "codec", None)
        if codec is None:
            codec = self._local.codec = TextCodec(copy.deepcopy(self._codec.tokenizer), chat_template=False)
        return len(codec.encode_prompt(prompt, chat_template=False))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
