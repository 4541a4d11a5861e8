"""The OpenAI server's side of Triton's gRPC stream, against a real Triton (the echo double behind a
real front): a call whose generation ended with its final response carries the next generation to
that front; a call left early, ended by Triton or idle past its time is never handed out again.

The oracle: the echo double answers a prompt's own text, so a generation that reads anything of
another generation's responses (a call handed out with a request still on it) gets the wrong text.
"""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from typing import Any

import pytest

from tokenrouter.openai_server.translate import Choice, Sampling, front_inputs
from tokenrouter.openai_server.triton_stream import TritonChannel

FRONT = "tokenrouter"
PROMPTS = ["alpha beta gamma", "one two three four", "the quick brown fox"]
LONG_PROMPT = " ".join(f"word{i}" for i in range(300))  # the echo streams one token per response


def _inputs(prompt: str) -> dict[str, Any]:
    sampling = Sampling(max_tokens=1000, temperature=0.0, top_p=1.0, seed=0, stops=[], presence_penalty=0.0,
                        frequency_penalty=0.0, logprobs=False, top_k=0, min_tokens=0, repetition_penalty=1.0,
                        stream=True)
    return front_inputs(prompt, sampling, seed=0)


def _opened_calls(channel: TritonChannel, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every ModelStreamInfer call the channel opens from now on."""
    calls: list[Any] = []
    open_call = channel._stub.ModelStreamInfer

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(open_call(*args, **kwargs))
        return calls[-1]

    monkeypatch.setattr(channel._stub, "ModelStreamInfer", counting)
    return calls


async def _text(channel: TritonChannel, prompt: str) -> str:
    choice = Choice(0, prompt, _inputs(prompt))
    async with aclosing(channel.generate(FRONT, choice.inputs, choice.outputs)) as replies:
        return "".join([reply.text async for reply in replies])


def test_a_call_that_ended_carries_the_next_generations(echo_server, monkeypatch: pytest.MonkeyPatch) -> None:
    async def run() -> tuple[list[str], list[str], int, int]:
        channel = TritonChannel(echo_server.grpc_url)
        opened = _opened_calls(channel, monkeypatch)
        one_by_one = [await _text(channel, prompt) for prompt in PROMPTS]
        sequential_calls = len(opened)
        at_once = await asyncio.gather(*(_text(channel, prompt) for prompt in PROMPTS * 2))
        concurrent_calls = len(opened)
        await channel.close()
        return one_by_one, at_once, sequential_calls, concurrent_calls

    one_by_one, at_once, sequential_calls, concurrent_calls = asyncio.run(run())
    assert one_by_one == PROMPTS
    assert at_once == PROMPTS * 2
    assert sequential_calls == 1, "each generation opened a call of its own"
    assert concurrent_calls == 6, "six generations at once need six calls (one was idle, five more)"


def test_a_generation_left_early_cancels_its_call_and_the_next_one_reads_only_its_own(
        echo_server, monkeypatch: pytest.MonkeyPatch) -> None:
    async def run() -> tuple[str, bool, int, str, int]:
        channel = TritonChannel(echo_server.grpc_url)
        opened = _opened_calls(channel, monkeypatch)
        choice = Choice(0, LONG_PROMPT, _inputs(LONG_PROMPT))
        async with aclosing(channel.generate(FRONT, choice.inputs, choice.outputs)) as replies:
            first = (await anext(replies)).text
        cancelled, idle = opened[0].cancelled(), len(channel.idle_streams)
        after = await _text(channel, PROMPTS[0])
        calls = len(opened)
        await channel.close()
        return first, cancelled, idle, after, calls

    first, cancelled, idle, after, calls = asyncio.run(run())
    assert first and LONG_PROMPT.startswith(first)
    assert after == PROMPTS[0], "the next generation read another generation's responses"
    assert cancelled, "the call of a generation left early was not cancelled"
    assert idle == 0
    assert calls == 2


def test_idle_calls_close_after_their_time_and_ended_calls_are_not_handed_out(
        echo_server, monkeypatch: pytest.MonkeyPatch) -> None:
    async def run() -> tuple[int, bool, int, list[str], int]:
        channel = TritonChannel(echo_server.grpc_url)
        channel.idle_streams.idle_s = 0.3
        opened = _opened_calls(channel, monkeypatch)
        texts = [await _text(channel, PROMPTS[0])]
        kept = len(channel.idle_streams)
        await asyncio.sleep(1.0)
        expired = opened[0].done() and len(channel.idle_streams) == 0
        channel.idle_streams.idle_s = 60.0
        texts.append(await _text(channel, PROMPTS[1]))
        opened[-1].cancel()  # as when Triton ends a call (a restart): it stays in the idle list, ended
        idle_ended = len(channel.idle_streams)
        texts.append(await _text(channel, PROMPTS[2]))
        calls = len(opened)
        await channel.close()
        return kept, expired, idle_ended, texts, calls

    kept, expired, idle_ended, texts, calls = asyncio.run(run())
    assert texts == PROMPTS
    assert kept == 1
    assert expired, "an idle call outlived its time"
    assert idle_ended == 1
    assert calls == 3, "an ended call was handed out again, or a live one was not"
