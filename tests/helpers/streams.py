"""A streamed OpenAI completion left open mid-way (to disconnect from, or to kill a worker under)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx


@contextmanager
def streaming(url: str, prompt: list[int], max_tokens: int, events: int = 20) -> Iterator[Iterator[str]]:
    """A completion of ``max_tokens`` forced tokens, read up to its ``events``-th data event; yields the
    rest of its lines. Leaving the block closes the stream (a client disconnect, if it is not over)."""
    body = {"model": "tokenrouter", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=120) as http, http.stream("POST", f"{url}/completions", json=body) as response:
        lines = response.iter_lines()
        seen = 0
        for line in lines:
            seen += line.startswith("data: {")
            if seen == events:
                break
        yield lines
