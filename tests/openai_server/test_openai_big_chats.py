"""Large chats cost their own clients time, not everyone's: a chat without max_tokens has its prompt
counted (tokenized) off the event loop, and one over the fronts' byte cap is refused before any
tokenizing. Eight ~1 MB chats at once beside a small chat: the small one is answered in < 1 s.

In-process (httpx on the ASGI app, one event loop as in the server) over a fake Triton channel.
"""

from __future__ import annotations

import asyncio
import json
import time

from .asgi_app import FRONT, openai_app, served_pair

BIG_CHATS = 8
BIG_BYTES = 1_000_000
BYSTANDER_S = 1.0
BYSTANDERS = 5


def _chat(content: str) -> bytes:
    return json.dumps({"model": FRONT, "messages": [{"role": "user", "content": content}]}).encode()


def _big_content(i: int) -> str:
    return (f"chat {i}: " + "the quick brown fox jumps over the lazy dog; " * (BIG_BYTES // 44))[:BIG_BYTES]


def test_big_chats_do_not_stall_a_bystander(tiny_codec) -> None:
    """A served pair whose context takes 1 MB prompts (so they must be tokenized: seconds each on this
    machine): while eight are being counted, small chats without max_tokens (one sent with them, then
    one every 0.1 s) get their answers at once, and the big ones are still at work after (they were in
    flight, not refused)."""
    served = served_pair(tiny_codec, context_limit=1 << 20, max_prompt_bytes=2 << 20, max_body_bytes=4 << 20)

    async def run() -> tuple[float, int]:
        async with openai_app(served) as (client, channel):
            big = [asyncio.create_task(client.post("/v1/chat/completions", content=_chat(_big_content(i))))
                   for i in range(BIG_CHATS)]
            latencies = []
            for _ in range(BYSTANDERS):  # the first right away: it queues behind the big ones' start
                start = time.monotonic()
                small = await client.post("/v1/chat/completions", content=_chat("Write a sort function."))
                latencies.append(time.monotonic() - start)
                assert small.status_code == 200 and small.json()["choices"][0]["message"]["content"] == "ok"
                await asyncio.sleep(0.1)
            still_counting = sum(not task.done() for task in big)
            for task in big:  # the client leaves: what a worker has not begun never runs
                task.cancel()
            await asyncio.gather(*big, return_exceptions=True)
            return max(latencies), still_counting

    latency, still_counting = asyncio.run(run())
    print(f"bystanders answered in {latency:.3f} s at most; {still_counting} big chats still being counted after")
    assert latency < BYSTANDER_S and still_counting >= BIG_CHATS - 1


def test_a_chat_over_the_byte_cap_is_refused_without_tokenizing(tiny_codec) -> None:
    """The tiny pair's limits (context 4096, 128 KiB of text): a 1 MB chat without max_tokens is a 400
    in milliseconds (tokenizing it would take seconds), before any front is called."""
    async def run() -> tuple[float, dict, int]:
        async with openai_app(served_pair(tiny_codec)) as (client, channel):
            start = time.monotonic()
            reply = await client.post("/v1/chat/completions", content=_chat(_big_content(0)))
            return time.monotonic() - start, reply.json(), len(channel.sent)

    elapsed, answer, sent = asyncio.run(run())
    assert answer["error"]["code"] == "context_length_exceeded" and answer["error"]["param"] == "messages"
    assert f"the limit is {32 * 4096}" in answer["error"]["message"] and sent == 0
    assert elapsed < 0.5
