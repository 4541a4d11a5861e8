"""The OpenAI server's pure parts: stop strings on streamed text, request checks, error mapping,
and the fronts' tensors a request becomes (no server)."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenrouter.openai_server import translate
from tokenrouter.openai_server.errors import OpenAIError, from_triton
from tokenrouter.openai_server.requests import ChatRequest, CompletionRequest, parse
from tokenrouter.openai_server.stops import StopText
from tokenrouter.openai_server.triton_stream import TritonCallError
from tokenrouter.serving.error_codes import coded_message, split_coded

ALPHABET = "ab\n "


@given(text=st.text(ALPHABET, max_size=40), stops=st.lists(st.text(ALPHABET, min_size=1, max_size=4), max_size=3),
       cuts=st.lists(st.integers(0, 40), max_size=8))
def test_stop_text_releases_exactly_the_text_before_the_first_stop(text: str, stops: list[str],
                                                                   cuts: list[int]) -> None:
    """Oracle: whatever the pieces the text arrives in, the reply ends at the first piece after which
    the text holds a stop string, before the earliest stop it then holds (the whole text when none
    occurs). A longer stop that begins earlier but is not whole yet does not wait: text = " aa",
    stops "a" and " aa", pieces " a" + "a": the reply is " " (a stream cannot take back what it sent
    without holding every stop's prefix back)."""
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])] or [""]
    matcher = StopText(stops)
    released = "".join(matcher.feed(piece, final=i == len(pieces) - 1) for i, piece in enumerate(pieces))
    expected, seen = text, ""
    for piece in pieces:
        seen += piece
        if found := [seen.find(stop) for stop in stops if stop in seen]:
            expected = seen[:min(found)]
            break
    assert released == expected
    assert matcher.stopped == any(stop in text for stop in stops)


def _held_back_naively(text: str, sent: int, stops: list[str]) -> int:
    """Where the released text ends while no stop is found: every prefix of every stop tried."""
    k = max((k for stop in stops for k in range(len(stop) - 1, 0, -1) if text.endswith(stop[:k])), default=0)
    return max(sent, len(text) - k)


@given(text=st.text(ALPHABET, max_size=40), stops=st.lists(st.text(ALPHABET, min_size=1, max_size=6), max_size=3),
       cuts=st.lists(st.integers(0, 40), max_size=8))
def test_stop_text_releases_each_piece_as_the_naive_hold_back_does(text: str, stops: list[str],
                                                                   cuts: list[int]) -> None:
    """Oracle, piece by piece: what is released after each piece is what trying every prefix of every
    stop string releases (the fast path only skips prefixes that could not change the answer)."""
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    matcher, seen, sent = StopText(stops), "", 0
    for a, b in zip(bounds, bounds[1:]):
        seen += text[a:b]
        released = matcher.feed(text[a:b])
        if matcher.stopped:
            return
        end = _held_back_naively(seen, sent, stops)
        assert released == seen[sent:end]
        sent = end


def test_a_long_stop_string_costs_little_per_piece() -> None:
    """A 100 KB stop string (the fronts take up to their text cap): trying each of its prefixes on each
    piece took 0.7 s a piece, on the event loop every client shares."""
    matcher = StopText(["x" * 100_000 + "END"])
    start = time.perf_counter()
    for _ in range(200):
        matcher.feed("hello world ")
    assert time.perf_counter() - start < 0.5 and not matcher.stopped


def test_stop_text_holds_back_only_what_may_start_a_stop() -> None:
    matcher = StopText(["END"])
    assert matcher.feed("abcE") == "abc"  # "E" might begin "END"
    assert matcher.feed("x") == "Ex"
    assert matcher.feed("yEN") == "y" and matcher.feed("D more", final=True) == "" and matcher.stopped


@pytest.mark.parametrize(("body", "param", "code"), [
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}, "tools",
     "unsupported_parameter"),
    ({"messages": [{"role": "user", "content": "hi"}], "stream_options": {"include_usage": True, "x": 1}},
     "stream_options.x", "unrecognized_argument"),
    ({"messages": []}, "messages", None),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages.0.content.str", None),
    ({"messages": [{"role": "user", "content": "hi"}], "seed": 2**64}, "seed", None),
    ({"messages": [{"role": "user", "content": "hi"}], "presence_penalty": -2.5}, "presence_penalty", None),
])
def test_chat_refusals_name_the_parameter(body: dict, param: str, code: str | None) -> None:
    with pytest.raises(OpenAIError) as refused:
        parse(ChatRequest, {"model": "m", **body})
    assert (refused.value.status, refused.value.param, refused.value.code) == (400, param, code)


def test_switched_off_values_of_refused_parameters_are_accepted() -> None:
    """What OpenAI clients send by default (tool_choice none, a text response format, empty bias)."""
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    request = parse(ChatRequest, {"model": "m", "messages": [{"role": "developer", "content": parts}],
                                  "tool_choice": "none", "response_format": {"type": "text"}, "logit_bias": {},
                                  "store": False, "user": "u", "parallel_tool_calls": True})
    assert request.messages[0].as_template_turn() == {"role": "system", "content": "ab"}


def test_completion_refusals() -> None:
    for body, param in (({"prompt": [1, 2]}, "prompt"), ({"prompt": "a", "suffix": "z"}, "suffix")):
        with pytest.raises(OpenAIError) as refused:
            parse(CompletionRequest, {"model": "m", **body})
        assert refused.value.param == param
    for body, param in (({"logprobs": 2}, "logprobs"), ({"echo": True, "logprobs": 0}, "echo"),
                        ({"best_of": 3}, "best_of")):
        with pytest.raises(OpenAIError) as refused:
            parse(CompletionRequest, {"model": "m", "prompt": "a", **body}).check()
        assert refused.value.param == param


@pytest.mark.parametrize(("message", "status", "param"), [
    (coded_message("INVALID_ARG", "stop_words hold 9 bytes; the limit is 8"), 400, "stop"),
    (coded_message("UNAVAILABLE", "server busy: 4 requests queued (max_queue 4); retry later"), 429, None),
    (coded_message("UNAVAILABLE", "the server is shutting down"), 503, None),
    (coded_message("INTERNAL", "internal error: KeyError: 'x'"), 500, None),
    ("Request for unknown model: 'tokenrouter' is not found", 503, None),  # Triton's own, while a front is unloaded
])
def test_front_errors_get_the_status_their_code_says(message: str, status: int, param: str | None) -> None:
    error = from_triton(TritonCallError(*split_coded(message)), translate.PARAMS)
    assert (error.status, error.param) == (status, param)
    assert error.response().headers.get("retry-after") == ("1" if status in (429, 503) else None)


def test_choices_are_one_front_request_each_numbered_as_openai_orders_them() -> None:
    sampling = translate.Sampling(max_tokens=5, temperature=0.7, top_p=1.0, seed=2**64 - 1, stops=["\n"],
                                  presence_penalty=0.0, frequency_penalty=0.5, logprobs=False, top_k=0, min_tokens=0,
                                  repetition_penalty=1.0, stream=False, end_ids=[7])
    choices = translate.choices(["p", "q"], 2, sampling)
    assert [(c.index, c.prompt) for c in choices] == [(0, "p"), (1, "p"), (2, "q"), (3, "q")]
    seeds = [int(c.inputs["seed"][0, 0]) for c in choices]
    assert seeds == [2**64 - 1, 0, 2**64 - 1, 0]  # seed + i, as the fronts number sequences
    inputs = choices[0].inputs
    assert bool(inputs["stream"][0, 0])  # a stop string is watched on the streamed text
    assert not bool(inputs["apply_chat_template"][0, 0]) and bool(inputs["exclude_input_in_output"][0, 0])
    assert "presence_penalty" not in inputs and float(inputs["frequency_penalty"][0, 0]) == 0.5
    assert "num_output_tokens" in choices[0].outputs and "output_log_probs" not in choices[0].outputs
