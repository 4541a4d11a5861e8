"""The fronts in front of a subserver double, on a real Triton server: TensorRT-LLM's interface over
gRPC (stream and unary ModelInfer) and HTTP (generate, generate_stream, infer), its output shapes,
batches and num_return_sequences, and a clear error for every bad input.

The double echoes the prompt's tokens, so the text a client gets back must be the prompt itself
(see echo_subserver_double.py); a token is "echo_large" when its position i has i % 3 == 2, and its
log probability is -(i + 1) / 8. `tokenrouter` is a decoupled front, `unary` a unary one.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from tokenrouter.client import (batch, grpc_infer, grpc_stream, http_generate, http_generate_stream, http_infer,
                                http_post, inputs)
from tokenrouter.text import TextCodec

from helpers.servers import UNARY

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
    replies = grpc_stream(echo_server.grpc_url, inputs(text_input=PROMPT, max_tokens=1000, stream=True))
    chunks = [r.text for r in replies]
    assert len(replies) == len(ids)  # one response per token, none lost (the last one carries FINAL)
    assert replies[-1].final and not any(r.final for r in replies[:-1])
    assert "".join(chunks) == PROMPT  # streaming never echoes the prompt
    assert "" in chunks[:-1]  # a partial character was held back until the token that completes it
    assert all("\ufffd" not in chunk for chunk in chunks)
    assert [i for r in replies for i in r.ids] == ids
    assert [m for r in replies for m in r.models] == ["echo_large" if i % 3 == 2 else "echo_small"
                                                      for i in range(len(ids))]
    assert [r.finish_reason for r in replies] == [""] * (len(ids) - 1) + ["eos"]
    assert replies[-1].large_share == pytest.approx(expected_share(len(ids)))


def test_outputs_have_tensorrt_llm_shapes(echo_server) -> None:
    """What TensorRT-LLM's clients index: text_output[0].decode(), batch_index[0][0], sequence_index[0][0],
    cum_log_probs [1, 1], output_log_probs [1, beams, tokens]. Catches [1, 1] text (end_to_end_grpc_client's
    crash) and missing indices."""
    reply, = grpc_stream(echo_server.grpc_url, inputs(text_input="alpha beta", max_tokens=3, return_log_probs=True,
                                                      exclude_input_in_output=True))
    n = len(reply.ids)
    assert reply["text_output"].shape == (1,) and isinstance(reply["text_output"][0].decode(), str)
    assert reply["batch_index"].shape == reply["sequence_index"].shape == (1, 1)
    assert reply["batch_index"][0][0] == reply["sequence_index"][0][0] == 0
    assert reply["cum_log_probs"].shape == (1, 1) and reply["output_log_probs"].shape == (1, 1, n)
    assert reply["output_ids"].shape == reply["output_models"].shape == (1, n)
    assert reply["finish_reason"].shape == reply["large_model_share"].shape == (1, 1)


def test_non_streaming_echoes_the_prompt_unless_excluded(echo_server, codec: TextCodec) -> None:
    """TensorRT-LLM's default (exclude_input_in_output false): the whole text starts with the prompt;
    output_ids are the generated tokens only."""
    prompt_ids = codec.encode_prompt(PROMPT)
    echoed, = grpc_stream(echo_server.grpc_url, inputs(text_input=PROMPT, max_tokens=7))
    assert echoed.text == codec.decode(prompt_ids + prompt_ids[:7]) and echoed.ids == prompt_ids[:7]
    assert echoed.finish_reason == "length"
    excluded, = grpc_stream(echo_server.grpc_url, inputs(text_input=PROMPT, max_tokens=7, exclude_input_in_output=True))
    assert excluded.text == codec.decode(prompt_ids[:7])


def test_log_probs_streamed_and_whole(echo_server, codec: TextCodec) -> None:
    n = len(codec.encode_prompt("alpha beta gamma"))
    want = [-(i + 1) / 8 for i in range(n)]
    streamed = grpc_stream(echo_server.grpc_url, inputs(text_input="alpha beta gamma", stream=True,
                                                        return_log_probs=True))
    assert [float(p) for r in streamed for p in r["output_log_probs"].reshape(-1)] == pytest.approx(want)
    assert [float(r["cum_log_probs"][0][0]) for r in streamed] == pytest.approx(np.cumsum(want).tolist())
    whole, = grpc_stream(echo_server.grpc_url, inputs(text_input="alpha beta gamma", return_log_probs=True))
    assert whole["output_log_probs"].reshape(-1).tolist() == pytest.approx(want)
    assert whole["cum_log_probs"][0][0] == pytest.approx(sum(want))
    plain, = grpc_stream(echo_server.grpc_url, inputs(text_input="alpha beta gamma"))
    assert "cum_log_probs" not in plain and "output_log_probs" not in plain


def test_a_batch_streams_each_row_as_its_own_generation(echo_server, codec: TextCodec) -> None:
    """Each row's responses carry its batch_index; FINAL comes once, after every row ended."""
    rows = ["one two three", "four five", "six seven eight nine"]
    replies = grpc_stream(echo_server.grpc_url, batch(*(inputs(text_input=p, stream=True) for p in rows)))
    assert replies[-1].final and sum(r.final for r in replies) == 1
    for index, prompt in enumerate(rows):
        mine = [r for r in replies if r["batch_index"][0][0] == index]
        assert "".join(r.text for r in mine) == prompt
        assert mine[-1].finish_reason == "eos"


def test_num_return_sequences_gives_indexed_sequences_per_row(echo_server) -> None:
    replies = grpc_stream(echo_server.grpc_url, batch(inputs(text_input="alpha", num_return_sequences=2,
                                                             exclude_input_in_output=True),
                                                      inputs(text_input="beta", num_return_sequences=2,
                                                             exclude_input_in_output=True)))
    seen = sorted((int(r["batch_index"][0][0]), int(r["sequence_index"][0][0]), r.text) for r in replies)
    assert seen == [(0, 0, "alpha"), (0, 1, "alpha"), (1, 0, "beta"), (1, 1, "beta")]


def test_only_the_outputs_a_client_asks_for(echo_server) -> None:
    import tritonclient.grpc as grpcclient

    from tokenrouter.client import grpc_inputs

    with grpcclient.InferenceServerClient(echo_server.grpc_url) as client:
        results = []
        client.start_stream(callback=lambda result, error: results.append((result, error)))
        client.async_stream_infer("tokenrouter", grpc_inputs(inputs(text_input="alpha beta", max_tokens=2)),
                                  outputs=[grpcclient.InferRequestedOutput("text_output")])
        client.stop_stream()
    (result, error), = results
    assert error is None and [o.name for o in result.get_response().outputs] == ["text_output"]


def test_http_generate_with_json_scalars(echo_server, codec: TextCodec) -> None:
    reply = http_generate(echo_server.http_url, {"text_input": PROMPT, "max_tokens": 5, "temperature": 0.0,
                                                 "top_p": 0.0, "top_k": 1, "seed": 7, "length_penalty": 1.5,
                                                 "beam_width": 1, "exclude_input_in_output": True})
    ids = codec.encode_prompt(PROMPT)[:5]
    assert reply["text_output"] == codec.decode(ids)
    assert reply["output_ids"] == ids and reply["batch_index"] == 0
    assert reply["finish_reason"] == "length"
    assert reply["large_model_share"] == pytest.approx(expected_share(5))


def test_http_generate_stream(echo_server) -> None:
    events = list(http_generate_stream(echo_server.http_url, {"text_input": PROMPT, "max_tokens": 1000,
                                                              "stream": True}))
    assert "".join(e["text_output"] for e in events) == PROMPT
    assert events[-1]["finish_reason"] == "eos"


def test_stop_words_and_end_id(echo_server, codec: TextCodec) -> None:
    prompt = "alpha beta gamma delta"
    stopped, = grpc_stream(echo_server.grpc_url, inputs(text_input=prompt, stop_words=["", " gamma"],
                                                        exclude_input_in_output=True))
    assert stopped.text == "alpha beta gamma" and stopped.finish_reason == "stop"
    end = codec.encode_prompt(" delta")[0]
    ended = http_generate(echo_server.http_url, {"text_input": prompt, "end_id": end, "exclude_input_in_output": True})
    assert ended["text_output"] == "alpha beta gamma" and ended["finish_reason"] == "eos"


def test_unary_front_over_grpc_infer_http_infer_and_generate(echo_server, codec: TextCodec) -> None:
    want = codec.decode(codec.encode_prompt(PROMPT)[:6])
    values = dict(text_input=PROMPT, max_tokens=6, exclude_input_in_output=True)
    assert grpc_infer(echo_server.grpc_url, inputs(**values), model=UNARY).text == want
    assert http_infer(echo_server.http_url, inputs(**values), model=UNARY).text == want
    assert http_generate(echo_server.http_url, values, model=UNARY)["text_output"] == want
    streamed = grpc_stream(echo_server.grpc_url, inputs(**values), model=UNARY)  # one response on a stream
    assert [r.text for r in streamed] == [want] and streamed[0].final
    # generate_stream on a unary model: one event
    assert [e["text_output"] for e in http_generate_stream(echo_server.http_url, values, model=UNARY)] == [want]


@pytest.mark.parametrize(("values", "message"), [
    (dict(stream=True), "stream true needs a decoupled front"),
    (dict(num_return_sequences=2), "num_return_sequences 2 needs a decoupled front"),
])
def test_the_unary_front_refuses_what_needs_several_responses(echo_server, values, message) -> None:
    with pytest.raises(InferenceServerException, match=message):
        grpc_infer(echo_server.grpc_url, inputs(text_input="x", **values), model=UNARY)
    with pytest.raises(InferenceServerException, match="a batch of 2 rows needs a decoupled front"):
        grpc_infer(echo_server.grpc_url, batch(inputs(text_input="a"), inputs(text_input="b")), model=UNARY)


def test_the_decoupled_front_refuses_unary_infer(echo_server) -> None:
    with pytest.raises(InferenceServerException, match="(?i)decoupled"):
        grpc_infer(echo_server.grpc_url, inputs(text_input="x"))


ACCEPTED_OFF = dict(beam_width=1, return_context_logits=False, return_generation_logits=False,
                    return_perf_metrics=False, num_draft_tokens=0, use_draft_logits=False, length_penalty=0.5,
                    top_p=0.0, pad_id=0, num_return_sequences=1)


def test_inputs_at_their_off_value_are_accepted(echo_server) -> None:
    reply, = grpc_stream(echo_server.grpc_url, inputs(text_input="alpha", exclude_input_in_output=True, **ACCEPTED_OFF))
    assert reply.text == "alpha"


BAD_INPUTS = [
    (dict(text_input=""), "text_input is empty"),
    (dict(text_input=b"caf\xc3"), "text_input is not valid UTF-8"),
    (dict(stop_words=["x"]), "text_input is missing"),
    (dict(text_input="x", stop_words=[b"\xff"]), "stop_words is not valid UTF-8"),
    (dict(text_input="x", end_id=10**6), "end_id .* outside the vocabulary"),
    (dict(text_input="x", pad_id=-1), "pad_id .* outside the vocabulary"),
    (dict(text_input="x", max_tokens=0), "max_tokens must be >= 1"),
    (dict(text_input="x", top_p=2.0), "top_p must be in"),
    (dict(text_input="x", temperature=math.nan), "temperature must be a finite number"),
    (dict(text_input="x", min_tokens=-1), "min_tokens must be >= 0"),
    (dict(text_input="x", repetition_penalty=math.nan), "repetition_penalty must be a finite number > 0"),
    (dict(text_input="x", repetition_penalty=0.0), "repetition_penalty must be a finite number > 0"),
    (dict(text_input="x", presence_penalty=math.nan), "presence_penalty must be a finite number"),
    (dict(text_input="x", frequency_penalty=math.inf), "frequency_penalty must be a finite number"),
    (dict(text_input="x", length_penalty=math.nan), "length_penalty must be a finite number"),
    (dict(text_input="x", seed=5, random_seed=6), "seed 5 and random_seed 6 disagree"),
    (dict(text_input="x", beam_width=4), "beam_width 4: only 1 is accepted; beam search is not supported"),
    (dict(text_input="x", num_return_sequences=0), "num_return_sequences must be >= 1"),
    (dict(text_input="x", return_context_logits=True), "return_context_logits True: only False is accepted"),
    (dict(text_input="x", return_generation_logits=True), "return_generation_logits True: .*use return_log_probs"),
    (dict(text_input="x", return_perf_metrics=True), "return_perf_metrics True: only False"),
    (dict(text_input="x", num_draft_tokens=3), "num_draft_tokens 3: .*speculative decoding is not supported"),
    (dict(text_input="x", embedding_bias_words=["a", "b"], embedding_bias_weights=[1.0]),
     "embedding_bias_words has 2 words and embedding_bias_weights 1 weights"),
    (dict(text_input="x", embedding_bias_words=["a"], embedding_bias_weights=[math.nan]),
     "embedding_bias_weights: the weight of 'a' must be a number below \\+inf"),
    (dict(text_input="x", lora_task_id=7), "lora_task_id: LoRA adapters are not supported"),
    (dict(text_input="x", decoder_text_input="y"), "decoder_text_input: encoder-decoder models only"),
    (dict(text_input="x", image_url_input="http://x/y.png"), "image_url_input: multimodal input is not supported"),
    (dict(text_input="x", prompt_vocab_size=4), "prompt_vocab_size: prompt tuning is not supported"),
    (dict(text_input="x", guided_decoding_guide_type="json"), "guided_decoding_guide_type: guided decoding is not"),
]


@pytest.mark.parametrize(("values", "message"), BAD_INPUTS, ids=[m.split(":")[0][:40] for _, m in BAD_INPUTS])
def test_bad_input_fails_that_request_only(echo_server, values: dict, message: str) -> None:
    with pytest.raises(InferenceServerException, match=message):
        grpc_stream(echo_server.grpc_url, inputs(**values))
    assert [r.text for r in grpc_stream(echo_server.grpc_url, inputs(text_input="ok"))] == ["okok"]


@pytest.mark.parametrize("name,array", [("max_tokens", np.array([[8.0]], dtype=np.float32)),
                                        ("seed", np.array([[8]], dtype=np.int32)),
                                        ("min_tokens", np.array([[1]], dtype=np.int64)),
                                        ("return_log_probs", np.array([[1]], dtype=np.int32)),
                                        ("repetition_penalty", np.array([[1.0]], dtype=np.float64))])
def test_a_wrong_dtype_is_refused_by_name(echo_server, name: str, array: np.ndarray) -> None:
    refusal = f"(?i){name}.*(data-type|datatype)|(data-type|datatype).*{name}"
    with pytest.raises(InferenceServerException, match=refusal):
        grpc_stream(echo_server.grpc_url, {**inputs(text_input="x"), name: array})


def test_a_batch_larger_than_max_batch_size_is_refused(echo_server) -> None:
    rows = batch(*(inputs(text_input=f"row {i}") for i in range(9)))  # the echo repository's fronts take 8
    with pytest.raises(InferenceServerException, match="batch-size must be <= 8"):
        grpc_stream(echo_server.grpc_url, rows)


def test_preprocessing_and_postprocessing_stand_alone(echo_server, codec: TextCodec) -> None:
    """TensorRT-LLM's schemas: preprocessing's QUERY, ... -> INPUT_ID, ... (a front's token ids, word lists
    in the [2, n] layout, a bias per vocabulary entry), postprocessing's TOKENS_BATCH -> OUTPUT."""
    status, text = http_post(echo_server.http_url, "/v2/models/preprocessing/infer", {"inputs": [
        {"name": "QUERY", "shape": [1, 1], "datatype": "BYTES", "data": ["alpha beta"]},
        {"name": "REQUEST_OUTPUT_LEN", "shape": [1, 1], "datatype": "INT32", "data": [5]},
        {"name": "STOP_WORDS_DICT", "shape": [1, 2], "datatype": "BYTES", "data": ["beta", ""]},
        {"name": "END_ID", "shape": [1, 1], "datatype": "INT32", "data": [3]},
        {"name": "EMBEDDING_BIAS_WORDS", "shape": [1, 1], "datatype": "BYTES", "data": ["alpha"]},
        {"name": "EMBEDDING_BIAS_WEIGHTS", "shape": [1, 1], "datatype": "FP32", "data": [2.0]}]})
    assert status == 200, text
    reply = {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in json.loads(text)["outputs"]}
    prompt, beta = codec.encode_prompt("alpha beta"), codec.token_sequences(["beta"])[0]
    assert reply["INPUT_ID"].tolist() == [prompt] and reply["REQUEST_INPUT_LEN"].tolist() == [[len(prompt)]]
    assert reply["STOP_WORDS_IDS"].tolist() == [[beta, [len(beta)] + [-1] * (len(beta) - 1)]]
    assert reply["BAD_WORDS_IDS"].shape == (1, 2, 0) and reply["OUT_END_ID"].tolist() == [[3]]
    assert reply["REQUEST_OUTPUT_LEN"].tolist() == [[5]] and reply["EMBEDDING_BIAS"].shape == (1, len(codec.tokenizer))
    assert set(np.flatnonzero(reply["EMBEDDING_BIAS"])) == set(codec.token_sequences(["alpha"])[0])
    ids = codec.encode_prompt("héllo")
    status, text = http_post(echo_server.http_url, "/v2/models/postprocessing/infer", {"inputs": [
        {"name": "TOKENS_BATCH", "shape": [1, 1, len(ids) + 2], "datatype": "INT32", "data": ids + [0, 0]},
        {"name": "SEQUENCE_LENGTH", "shape": [1, 1], "datatype": "INT32", "data": [len(ids)]}]})
    assert status == 200, text
    assert json.loads(text)["outputs"][0]["data"] == ["héllo"]


@pytest.mark.parametrize("ids, message", [
    ([2**31 - 1], r"TOKENS_BATCH holds id 2147483647, outside the vocabulary \[0, "),
    ([-1], r"TOKENS_BATCH holds id -1, outside the vocabulary"),
    ([1] * 100_000, r"TOKENS_BATCH must be \[rows, beams, n\] with n <= \d+ \(the context limit\), "
                    r"got \[1, 1, 100000\]"),
])
def test_postprocessing_refuses_ids_it_cannot_decode(echo_server, ids, message) -> None:
    """A client calls postprocessing directly: out-of-vocabulary ids answered INTERNAL OverflowError
    and a million of them took seconds; now a 400 that names the input (the size by the shape alone),
    and the model serves on."""
    def post(tokens: list[int]) -> tuple[int, str]:
        return http_post(echo_server.http_url, "/v2/models/postprocessing/infer", {"inputs": [
            {"name": "TOKENS_BATCH", "shape": [1, 1, len(tokens)], "datatype": "INT32", "data": tokens},
            {"name": "SEQUENCE_LENGTH", "shape": [1, 1], "datatype": "INT32", "data": [len(tokens)]}]})

    status, text = post(ids)
    assert status == 400 and re.search(message, json.loads(text)["error"]), (status, text[:300])
    status, text = post([40])
    assert status == 200, text
