"""The OpenAI-compatible server against real clients: the official `openai` SDK (sync and async),
LangChain's ChatOpenAI, and curl with the request bodies of OpenAI's API reference, over loopback
on the tiny pair routed 30 % to the large model (the session's routing server and the OpenAI server on it).

The oracles: prompt tokens are the tokenizer's count of the chat template (or the prompt); a greedy
reply streamed is the same reply whole; a stop string cuts the greedy reply before its first
occurrence; choice i of seed s is choice 0 of seed s + i (the fronts' numbering); the same seed gives
the same sample and another seed another one.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import httpx
import openai
import pytest

from tokenrouter.text import TextCodec

from helpers.servers import OPENAI_KEY as KEY

MODEL = "tokenrouter"
HELLO = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "Write a sort function."}]


@pytest.fixture(scope="module")
def client(openai_api) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{openai_api.url}/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def codec(tiny_pair: dict[str, Path]) -> TextCodec:
    return TextCodec.from_path(tiny_pair["small"])


def chat(client: openai.OpenAI, **kwargs):
    return client.chat.completions.create(**{"model": MODEL, "messages": HELLO, "max_tokens": 12, **kwargs})


def greedy_text(client: openai.OpenAI, max_tokens: int = 24) -> str:
    return chat(client, temperature=0, max_tokens=max_tokens).choices[0].message.content


def test_chat_reply_with_usage_counted_by_the_tokenizer(client, codec) -> None:
    """Non-streaming chat: text, finish 'length' at max_tokens, usage = the tokenizer's count of the
    rendered chat template and the output, our extras (policy, large model share)."""
    reply = chat(client, max_tokens=12, temperature=0)
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and reply.model == MODEL and choice.message.role == "assistant"
    assert choice.message.content and choice.finish_reason == "length"
    prompt = codec.tokenizer.encode(codec.tokenizer.render_chat(HELLO), add_special_tokens=False)
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (len(prompt), 12)
    assert reply.usage.total_tokens == len(prompt) + 12
    assert reply.routing_policy == "random" and 0.0 <= choice.large_model_share <= 1.0


def test_streamed_chat_is_the_whole_reply_in_openai_chunks(client) -> None:
    """Streaming: the role first, content deltas that join to the non-streamed greedy reply, the last
    choice chunk with its finish reason and the large model's share, then the usage chunk."""
    whole = greedy_text(client)
    chunks = list(chat(client, temperature=0, max_tokens=24, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices]
    assert "".join(content) == whole and len([c for c in content if c]) > 1
    finishing = [chunk.choices[0] for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    assert [c.finish_reason for c in finishing] == ["length"] and 0 <= finishing[0].large_model_share <= 1
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
    assert all(chunk.usage is None for chunk in chunks[:-1])


def test_seeds_reproduce_samples_and_n_numbers_them(client) -> None:
    """temperature 1: a seed gives the same sample twice, another seed another sample; n = 2 with seed
    s answers the samples of seeds s and s + 1."""
    two = chat(client, temperature=1.0, seed=40, n=2)
    texts = [choice.message.content for choice in sorted(two.choices, key=lambda c: c.index)]
    assert len(texts) == 2 and texts[0] != texts[1]
    assert chat(client, temperature=1.0, seed=40).choices[0].message.content == texts[0]
    assert chat(client, temperature=1.0, seed=41).choices[0].message.content == texts[1]
    assert two.usage.completion_tokens == 24


def test_stop_string_cuts_the_reply_before_it(client) -> None:
    """A stop string taken from the middle of the greedy reply: the reply ends right before its first
    occurrence (left out, as OpenAI does), finish 'stop', streamed and not."""
    whole = greedy_text(client, max_tokens=32)
    stop = whole[len(whole) // 2:len(whole) // 2 + 3]
    expected = whole[:whole.index(stop)]
    cut = chat(client, temperature=0, max_tokens=32, stop=[stop, "never-in-this-text"])
    assert (cut.choices[0].message.content, cut.choices[0].finish_reason) == (expected, "stop")
    streamed = list(chat(client, temperature=0, max_tokens=32, stop=stop, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == expected
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_completions_prompts_times_n_in_openai_order_with_echo(client, codec) -> None:
    """Two prompts x n = 2: four choices, choice p*n + i is sample i of prompt p; echo puts the prompt
    first; usage counts each prompt once."""
    prompts = ["def add(a, b):", "class Stack:"]
    reply = client.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=6, echo=True, seed=3)
    choices = sorted(reply.choices, key=lambda c: c.index)
    assert [c.index for c in choices] == [0, 1, 2, 3] and reply.object == "text_completion"
    for choice in choices:
        assert choice.text.startswith(prompts[choice.index // 2]) and choice.finish_reason == "length"
    alone = client.completions.create(model=MODEL, prompt=prompts[1], max_tokens=6, seed=4)  # sample 1 of prompt 1
    assert choices[3].text == prompts[1] + alone.choices[0].text
    assert reply.usage.prompt_tokens == sum(len(codec.encode_prompt(p)) for p in prompts)
    assert reply.usage.completion_tokens == 4 * 6


def test_streamed_completion_with_logprobs(client) -> None:
    """A streamed completion joins to the whole one; logprobs (0: the sampled token's) come per token."""
    whole = client.completions.create(model=MODEL, prompt="import os", max_tokens=10, temperature=0, logprobs=0)
    logprobs = whole.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == 10 == whole.usage.completion_tokens
    assert "".join(logprobs.tokens) == whole.choices[0].text and all(lp <= 0 for lp in logprobs.token_logprobs)
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(10)]
    parts = list(client.completions.create(model=MODEL, prompt="import os", max_tokens=10, temperature=0, stream=True))
    assert "".join(part.choices[0].text for part in parts) == whole.choices[0].text


def test_chat_logprobs_one_per_token(client) -> None:
    reply = chat(client, temperature=0, logprobs=True)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens == 12
    assert "".join(item.token for item in content) == reply.choices[0].message.content
    assert all(item.logprob <= 0 and item.top_logprobs == [] for item in content)


def test_async_client_streams_and_whole_replies_at_once(openai_api) -> None:
    """AsyncOpenAI: chat and completions, streamed and whole, all four at the same time."""
    async def run() -> list[str]:
        async with openai.AsyncOpenAI(base_url=f"{openai_api.url}/v1", api_key=KEY, max_retries=0) as aclient:
            async def streamed_chat() -> str:
                stream = await aclient.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8,
                                                               temperature=0, stream=True)
                return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

            async def streamed_completion() -> str:
                stream = await aclient.completions.create(model=MODEL, prompt="x = [", max_tokens=8, temperature=0,
                                                          stream=True)
                return "".join([c.choices[0].text async for c in stream])

            whole_chat = aclient.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, temperature=0)
            whole_completion = aclient.completions.create(model=MODEL, prompt="x = [", max_tokens=8, temperature=0)
            a, b, c, d = await asyncio.gather(streamed_chat(), streamed_completion(), whole_chat, whole_completion)
            return [a, c.choices[0].message.content, b, d.choices[0].text]

    chat_stream, chat_whole, completion_stream, completion_whole = asyncio.run(run())
    assert chat_stream == chat_whole and completion_stream == completion_whole and chat_whole


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"temperature": 2.5}, "temperature"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"logit_bias": {"12": 3}}, "logit_bias"),
    ({"top_logprobs": 3, "logprobs": True}, "top_logprobs"),
    ({"extra_body": {"guided_json": {}}}, "guided_json"),
    ({"messages": [{"role": "tool", "content": "42", "tool_call_id": "a"}]}, "messages.0.role"),
    ({"max_tokens": 100000}, "messages"),  # refused by the front: prompt + max_tokens over the context
    ({"n": 17}, "n"),
])
def test_bad_requests_are_openai_400s_naming_the_parameter(client, kwargs: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        chat(client, **kwargs)
    error = refused.value.body
    assert refused.value.status_code == 400 and error["param"] == param and error["type"] == "invalid_request_error"
    assert greedy_text(client, 4)  # and the server goes on


def test_unknown_model_and_api_key(openai_api, client) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        chat(client, model="slm")  # an internal model is not a client model
    assert missing.value.body["code"] == "model_not_found"
    for key in ("wrong-key", ""):
        wrong = openai.OpenAI(base_url=f"{openai_api.url}/v1", api_key=key or "x", max_retries=0,
                              default_headers={} if key else {"Authorization": ""})
        with pytest.raises(openai.AuthenticationError):
            chat(wrong)
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()


def test_models_lists_the_fronts_only_and_health(openai_api, client) -> None:
    models = client.models.list().data
    assert [(m.id, m.owned_by, m.object) for m in models] == [(MODEL, "tokenrouter", "model")]
    assert isinstance(models[0].created, int) and client.models.retrieve(MODEL).id == MODEL
    assert httpx.get(f"{openai_api.url}/health").status_code == 200  # no key needed: a probe's


def test_body_over_the_cap_is_refused_before_parsing(openai_api) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    big = b'{"model": "tokenrouter", "messages": [{"role": "user", "content": "' + b"a" * (9 << 20) + b'"}]}'
    reply = httpx.post(f"{openai_api.url}/v1/chat/completions", content=big, headers=headers, timeout=60)
    assert reply.status_code == 413 and reply.json()["error"]["code"] == "request_too_large"
    parts = iter([big[i:i + 65536] for i in range(0, len(big), 65536)])  # no Content-Length: counted as it comes
    chunked = httpx.post(f"{openai_api.url}/v1/chat/completions", content=parts, headers=headers, timeout=60)
    assert chunked.status_code == 413
    broken = httpx.post(f"{openai_api.url}/v1/chat/completions", content=b"{not json", headers=headers)
    assert broken.status_code == 400 and "not valid JSON" in broken.json()["error"]["message"]
    deep = httpx.post(f"{openai_api.url}/v1/chat/completions", content=b"[" * 200_000, headers=headers)
    assert deep.status_code == 400 and "nested too deeply" in deep.json()["error"]["message"]


def test_the_served_port_has_the_http_limits(openai_api) -> None:
    """The served process runs the guarded protocol (tests/openai_server/test_openai_http_limits.py
    holds each limit): a 40 KB header is a 431 with OpenAI's error body; the server serves after it."""
    reply = httpx.get(f"{openai_api.url}/v1/models", headers={"Authorization": f"Bearer {KEY}", "X-Big": "a" * 40_000})
    assert reply.status_code == 431 and "over the limit of 32768 bytes" in reply.json()["error"]["message"]
    assert httpx.get(f"{openai_api.url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


def _curl(openai_api, path: str, body: dict) -> str:
    return subprocess.run(["curl", "-sS", "-N", f"{openai_api.url}{path}", "-H", "Content-Type: application/json",
                           "-H", f"Authorization: Bearer {KEY}", "-d", json.dumps(body)],
                          check=True, capture_output=True, text=True, timeout=120).stdout


def test_curl_bodies_from_openais_api_reference(openai_api) -> None:
    """The reference's examples (model name ours): chat default, chat streaming, legacy completion."""
    default = json.loads(_curl(openai_api, "/v1/chat/completions", {"model": MODEL, "messages": [
        {"role": "developer", "content": "You are a helpful assistant."}, {"role": "user", "content": "Hello!"}]}))
    assert default["choices"][0]["message"]["role"] == "assistant" and default["usage"]["completion_tokens"] > 0
    events = _curl(openai_api, "/v1/chat/completions", {"model": MODEL, "messages": [
        {"role": "developer", "content": "You are a helpful assistant."}, {"role": "user", "content": "Hello!"}],
        "stream": True, "max_tokens": 6}).split("\n\n")
    assert all(e.startswith("data: ") for e in events if e) and events[-2] == "data: [DONE]" and events[-1] == ""
    assert json.loads(events[0][6:])["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    legacy = json.loads(_curl(openai_api, "/v1/completions", {"model": MODEL, "prompt": "Say this is a test",
                                                       "max_tokens": 7, "temperature": 0}))
    assert legacy["usage"]["completion_tokens"] == 7 and legacy["choices"][0]["finish_reason"] == "length"


def test_langchain_chat_openai(openai_api, client) -> None:
    """LangChain's ChatOpenAI, invoke and stream, gets what the SDK gets."""
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=f"{openai_api.url}/v1", api_key=KEY, model=MODEL, temperature=0, max_tokens=12,
                     max_retries=0)
    messages = [("system", HELLO[0]["content"]), ("human", HELLO[1]["content"])]
    expected = greedy_text(client, 12)
    assert llm.invoke(messages).content == expected
    assert "".join(chunk.content for chunk in llm.stream(messages)) == expected
