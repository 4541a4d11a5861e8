"""preprocessing -> (subserver double) -> postprocessing through the `tokenrouter` ensemble of a real
Triton server: gRPC streaming and not, HTTP generate and generate_stream, bad input.

The double echoes the prompt's tokens, so the text a client gets back must be the prompt itself
(see echo_subserver_double.py); a token is "echo_large" when its position i has i % 3 == 2.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tritonclient.utils import InferenceServerException

from tokenrouter.text import TextCodec

from .clients import grpc_inputs, grpc_stream, http_generate, http_generate_stream, texts

# multi-byte characters that a 4k-token byte-level BPE splits over several tokens
PROMPT = "def greet(name):\n    return f\"héllo {name} 🙂 — 你好, wörld\"\n"


@pytest.fixture(scope="module")
def codec(tiny_tokenizer: Path) -> TextCodec:
    return TextCodec.from_path(tiny_tokenizer)


def expected_share(n: int) -> float:
    return sum(1 for i in range(n) if i % 3 == 2) / n


def test_prompt_splits_characters_over_tokens(codec: TextCodec) -> None:
    # guards the UTF-8 tests below: they prove nothing unless some token is a partial character
    ids = codec.encode_prompt(PROMPT)
    assert any("\ufffd" in codec.decode([i]) for i in ids)


def test_grpc_stream_is_utf8_safe_and_attributed(echo_server, codec: TextCodec) -> None:
    ids = codec.encode_prompt(PROMPT)
    responses = grpc_stream(echo_server.grpc_url, grpc_inputs(text_input=PROMPT, max_tokens=1000, stream=True))
    chunks = texts(responses)
    assert len(responses) == len(ids)  # one response per token, none lost (the last one carries FINAL)
    assert "".join(chunks) == PROMPT
    assert "" in chunks[:-1]  # a partial character was held back until the token that completes it
    assert all("\ufffd" not in chunk for chunk in chunks)
    assert [int(r["output_ids"].reshape(-1)[0]) for r in responses] == ids
    models = [m.decode() for r in responses for m in r["output_models"].reshape(-1)]
    assert models == ["echo_large" if i % 3 == 2 else "echo_small" for i in range(len(ids))]
    reasons = [r["finish_reason"].reshape(-1)[0].decode() for r in responses]
    assert reasons == [""] * (len(ids) - 1) + ["eos"]
    assert responses[-1]["large_model_share"].reshape(-1)[0] == pytest.approx(expected_share(len(ids)))


def test_grpc_without_stream_gives_one_response(echo_server, codec: TextCodec) -> None:
    responses = grpc_stream(echo_server.grpc_url, grpc_inputs(text_input=PROMPT, max_tokens=7, stream=False))
    assert len(responses) == 1
    ids = codec.encode_prompt(PROMPT)[:7]
    assert texts(responses) == [codec.decode(ids)]
    assert responses[0]["output_ids"].reshape(-1).tolist() == ids
    assert responses[0]["finish_reason"].reshape(-1)[0] == b"length"


def test_http_generate_with_json_scalars(echo_server, codec: TextCodec) -> None:
    reply = http_generate(echo_server.http_url, {"text_input": PROMPT, "max_tokens": 5, "temperature": 0.0,
                                                 "top_p": 1.0, "top_k": 1, "random_seed": 7})
    ids = codec.encode_prompt(PROMPT)[:5]
    assert reply["text_output"] == codec.decode(ids)
    assert reply["output_ids"] == ids
    assert reply["finish_reason"] == "length"
    assert reply["large_model_share"] == pytest.approx(expected_share(5))


def test_http_generate_stream(echo_server) -> None:
    events = http_generate_stream(echo_server.http_url, {"text_input": PROMPT, "max_tokens": 1000, "stream": True})
    assert "".join(e["text_output"] for e in events) == PROMPT
    assert events[-1]["finish_reason"] == "eos"


def test_stop_words_and_end_id(echo_server, codec: TextCodec) -> None:
    prompt = "alpha beta gamma delta"
    stopped = grpc_stream(echo_server.grpc_url, grpc_inputs(text_input=prompt, stop_words=["", " gamma"], stream=False))
    assert texts(stopped) == ["alpha beta gamma"]
    assert stopped[0]["finish_reason"].reshape(-1)[0] == b"stop"
    end = codec.encode_prompt(" delta")[0]
    ended = http_generate(echo_server.http_url, {"text_input": prompt, "end_id": end})
    assert ended["text_output"] == "alpha beta gamma" and ended["finish_reason"] == "eos"


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (dict(text_input=""), "text_input is empty"),
        (dict(text_input=b"caf\xc3"), "text_input is not valid UTF-8"),
        (dict(text_input="x", stop_words=[b"\xff"]), "stop_words is not valid UTF-8"),
        (dict(text_input="x", end_id=10**6), "outside the vocabulary"),
        (dict(stop_words=["x"]), "text_input is missing"),
        # sampling inputs reach preprocessing too, so this request still gets a named error
        (dict(max_tokens=3), "text_input is missing"),
        (dict(text_input="x", max_tokens=0), "max_tokens must be >= 1"),
        (dict(text_input="x", top_p=2.0), "top_p must be in"),
    ],
)
def test_bad_input_fails_that_request_only(echo_server, inputs: dict, message: str) -> None:
    with pytest.raises(InferenceServerException, match=message):
        grpc_stream(echo_server.grpc_url, grpc_inputs(**inputs))
    assert texts(grpc_stream(echo_server.grpc_url, grpc_inputs(text_input="ok"))) == ["ok"]


def test_batch_of_two_is_refused(echo_server) -> None:
    import numpy as np
    import tritonclient.grpc as grpcclient

    batch = grpcclient.InferInput("text_input", [2, 1], "BYTES")
    batch.set_data_from_numpy(np.array([[b"a"], [b"b"]], dtype=object))
    with pytest.raises(InferenceServerException, match="batch-size must be <= 1"):
        grpc_stream(echo_server.grpc_url, [batch])
