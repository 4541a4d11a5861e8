"""The OpenAI server as strict as OpenAI: no client input gets a 500, integers never wrap on the way to
the fronts' INT32 inputs, a wrong JSON type is a 400 (never coerced), invalid Unicode is a 400 naming
its field, and vLLM's ``ignore_eos`` reaches the fronts as min_tokens = max_tokens.

In-process (httpx on the ASGI app) over a fake Triton channel that keeps what each generation was sent.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .asgi_app import FRONT, openai_app, served_pair

INT32_MAX = 2**31 - 1
CHAT = {"model": FRONT, "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": FRONT, "prompt": "def f():"}
LONE = "\ud800"  # half a UTF-16 pair: json.dumps writes it as the escape "\ud800"


def post(codec, path: str, body: Any, raw: bytes | None = None) -> tuple[int, dict, list[dict]]:
    """(status, JSON answer, the fronts' inputs of each generation as Python values)."""
    async def run() -> tuple[int, dict, list[dict]]:
        async with openai_app(served_pair(codec)) as (client, channel):
            reply = await client.post(path, content=raw if raw is not None else json.dumps(body).encode())
            sent = [{name: array.reshape(-1).tolist() for name, array in inputs.items()} for inputs in channel.sent]
            return reply.status_code, reply.json(), sent
    return asyncio.run(run())


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", {**COMPLETION, "prompt": f"a{LONE}b"}, "prompt"),
    ("/v1/completions", {**COMPLETION, "prompt": ["fine", f"x{LONE}"]}, "prompt.1"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": LONE}]}, "messages.0.content"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": LONE}]}]},
     "messages.0.content.0.text"),
    ("/v1/chat/completions", {**CHAT, "stop": ["ok", f"{LONE}!"]}, "stop.1"),
    ("/v1/completions", {**COMPLETION, "stop": LONE}, "stop"),
    ("/v1/chat/completions", {**CHAT, "model": f"m{LONE}"}, "model"),
    ("/v1/chat/completions", {**CHAT, f"k{LONE}": 1}, "k\\ud800"),  # an unknown key would be echoed back
])
def test_lone_surrogates_are_400s_naming_the_field(tiny_codec, path: str, body: dict, param: str) -> None:
    status, answer, sent = post(tiny_codec, path, body)
    assert status == 400 and answer["error"]["param"] == param and answer["error"]["code"] == "invalid_unicode"
    assert not sent


def test_a_valid_surrogate_pair_is_text() -> None:
    """An emoji escaped as a UTF-16 pair ("\\ud83d\\ude00") is valid: only half a pair is refused."""
    from tokenrouter.openai_server.requests import lone_surrogate_path

    assert lone_surrogate_path(json.loads('{"a": ["\\ud83d\\ude00"]}')) is None
    assert lone_surrogate_path(json.loads('{"a": ["x", "\\ude00"]}')) == ("a", 1)


@pytest.mark.parametrize(("path", "field", "value", "low"), [
    ("/v1/chat/completions", "max_tokens", 4294967301, 1),  # 2^32 + 5 once wrapped to 5 tokens
    ("/v1/chat/completions", "max_tokens", INT32_MAX + 1, 1),  # once refused as "got -2147483648"
    ("/v1/chat/completions", "max_completion_tokens", 2**63, 1),
    ("/v1/chat/completions", "top_k", 4294967297, 0),
    ("/v1/chat/completions", "min_tokens", 4294967297, 0),
    ("/v1/completions", "max_tokens", 2**64, 1),
    ("/v1/completions", "n", 2**63, 1),
    ("/v1/completions", "best_of", INT32_MAX + 1, 1),
    ("/v1/completions", "top_k", -1, 0),
])
def test_integers_outside_the_fronts_range_are_400s_naming_field_and_range(tiny_codec, path: str, field: str,
                                                                          value: int, low: int) -> None:
    base = CHAT if path == "/v1/chat/completions" else COMPLETION
    status, answer, sent = post(tiny_codec, path, {**base, field: value})
    assert status == 400 and answer["error"]["param"] == field and not sent
    assert f"{value} is out of range: expected an integer from {low} to {INT32_MAX}" in answer["error"]["message"]


def test_the_largest_int32_reaches_the_fronts_unwrapped(tiny_codec) -> None:
    status, _, sent = post(tiny_codec, "/v1/completions", {**COMPLETION, "max_tokens": INT32_MAX, "top_k": INT32_MAX,
                                                           "min_tokens": INT32_MAX})
    assert status == 200
    assert (sent[0]["max_tokens"], sent[0]["top_k"], sent[0]["min_tokens"]) == ([INT32_MAX],) * 3


@pytest.mark.parametrize(("field", "value", "expected", "got"), [
    ("n", "2", "an integer", "a string"),
    ("stream", "yes", "a boolean", "a string"),
    ("stream", 1, "a boolean", "an integer"),
    ("temperature", "0.5", "a number", "a string"),
    ("max_tokens", 2.0, "an integer", "a decimal number"),
    ("max_tokens", True, "an integer", "a boolean"),
    ("logprobs", "true", "a boolean", "a string"),
    ("ignore_eos", "true", "a boolean", "a string"),
    ("seed", "7", "an integer", "a string"),
])
def test_wrong_json_types_are_openai_400s_not_coerced(tiny_codec, field: str, value: Any, expected: str,
                                                      got: str) -> None:
    status, answer, sent = post(tiny_codec, "/v1/chat/completions", {**CHAT, field: value})
    assert status == 400 and not sent
    assert answer["error"] == {"message": f"Invalid type for '{field}': expected {expected}, but got {got} instead.",
                               "type": "invalid_request_error", "param": field, "code": "invalid_type"}


def test_an_integer_is_a_number() -> None:
    """OpenAI takes ``temperature: 1``: strict does not mean float-only."""
    from tokenrouter.openai_server.requests import ChatRequest, parse

    assert parse(ChatRequest, {**CHAT, "temperature": 1, "top_p": 1}).temperature == 1.0


@pytest.mark.parametrize("raw", [b'{"model": "tokenrouter", "prompt": "a", "temperature": NaN}',
                                 b'{"model": "tokenrouter", "prompt": "a", "top_p": -Infinity}'])
def test_non_json_numbers_are_refused(tiny_codec, raw: bytes) -> None:
    status, answer, _ = post(tiny_codec, "/v1/completions", None, raw=raw)
    assert status == 400 and "not a JSON value" in answer["error"]["message"]


@pytest.mark.parametrize(("path", "body", "tokens"), [
    ("/v1/chat/completions", {**CHAT, "max_tokens": 7}, 7),
    ("/v1/completions", {**COMPLETION, "max_tokens": 9, "min_tokens": 2}, 9),  # ignore_eos wins over min_tokens
    ("/v1/completions", COMPLETION, 16),  # completions' default max_tokens
])
def test_ignore_eos_is_min_tokens_equal_to_max_tokens(tiny_codec, path: str, body: dict, tokens: int) -> None:
    status, _, sent = post(tiny_codec, path, {**body, "ignore_eos": True})
    assert status == 200 and sent[0]["max_tokens"] == sent[0]["min_tokens"] == [tokens]
    status, _, sent = post(tiny_codec, path, {**body, "ignore_eos": False})
    assert status == 200 and sent[0].get("min_tokens", [0]) == [body.get("min_tokens", 0)]


def test_ignore_eos_without_max_tokens_fills_the_context(tiny_codec) -> None:
    """A chat without max_tokens may write as many tokens as the context holds: with ignore_eos, all of them."""
    prompt = tiny_codec.tokenizer.encode(tiny_codec.tokenizer.render_chat(CHAT["messages"]), add_special_tokens=False)
    status, _, sent = post(tiny_codec, "/v1/chat/completions", {**CHAT, "ignore_eos": True})
    assert status == 200 and sent[0]["max_tokens"] == sent[0]["min_tokens"] == [4096 - len(prompt)]


TEXTS = st.text(st.sampled_from(["a", " ", "\x00", "\u00e9", "\U0001f600", LONE, "\udfff"]), max_size=6)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | TEXTS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXTS, inner, max_size=3), max_leaves=8)
FIELDS = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "n", "temperature", "top_p", "seed",
          "stop", "stream", "stream_options", "top_k", "min_tokens", "ignore_eos", "repetition_penalty", "logprobs",
          "top_logprobs", "echo", "best_of", "presence_penalty", "user", "metadata", "response_format", "tool_choice"]
# texts where texts are due, so that a body gets past type checks with odd text in it
TEXT_FIELDS = st.fixed_dictionaries({}, optional={
    "prompt": TEXTS | st.lists(TEXTS, max_size=3), "stop": TEXTS | st.lists(TEXTS, max_size=3), "user": TEXTS,
    "messages": st.lists(st.fixed_dictionaries({
        "role": st.sampled_from(["user", "system", "tool"]),
        "content": TEXTS | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXTS}), max_size=2)}),
        max_size=2)})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]),
       overrides=TEXT_FIELDS | st.dictionaries(st.sampled_from(FIELDS) | TEXTS, JSON_VALUES, max_size=3))
def test_no_client_input_gets_a_500(tiny_codec, path: str, overrides: dict) -> None:
    """Any JSON value in any field or as a key (lone surrogates, integers past int64, nested junk), odd
    text where text is due: a 2xx or a 4xx."""
    base = CHAT if path == "/v1/chat/completions" else COMPLETION
    status, answer, _ = post(tiny_codec, path, {**base, **overrides})
    assert status < 500, answer
    assert status == 200 or answer["error"]["message"]
