"""The requests third-party Triton LLM clients send, as they send them, against the fronts.

Written from tensorrtllm_backend's inflight_batcher_llm/client/end_to_end_grpc_client.py (c2e65b88)
and llama-index's NvidiaTriton LLM (llama-index-llms-nvidia-triton 0.6.0): the same tensors,
shapes and dtypes, the same way of streaming (no empty final response, stop_stream right after
sending) and the same reading of the results. Those packages are not needed here: they were run
by hand against `tokenrouter serve --tiny` (docs/compatibility.md). The subserver double echoes the
prompt (echo_subserver_double.py), so the text that comes back is known.
"""

from __future__ import annotations

import queue
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype

from tokenrouter.client import GrpcStream, Reply, grpc_infer
from tokenrouter.text import TextCodec

from helpers.servers import CHAT_FRONT, OPENAI_FRONT, UNARY

@pytest.fixture(scope="module")
def codec(tiny_tokenizer: Path) -> TextCodec:
    return TextCodec.from_path(tiny_tokenizer)


def _tensor(name: str, array: np.ndarray) -> grpcclient.InferInput:
    t = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    t.set_data_from_numpy(array)
    return t


def _stream_like_end_to_end_client(url: str, model: str, arrays: dict[str, np.ndarray],
                                   outputs: list[str]) -> list:
    """end_to_end_grpc_client's way: start_stream, one async_stream_infer without an empty final
    response, stop_stream at once (which waits for the stream's end), then read what came."""
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: results.put(error or result))
    client.async_stream_infer(model, [_tensor(n, a) for n, a in arrays.items()],
                              outputs=[grpcclient.InferRequestedOutput(o) for o in outputs], request_id="")
    client.stop_stream()
    client.close()
    return [results.get_nowait() for _ in range(results.qsize())]


def _end_to_end_inputs(prompt: str, *, streaming: bool, exclude: bool = False, stop_words=(), bad_words=(),
                       log_probs: bool = False) -> dict[str, np.ndarray]:
    """prepare_inputs() of end_to_end_grpc_client with its defaults (output_len 100, temperature 1.0)."""
    inputs = {"text_input": np.array([[prompt]]).astype(object),
              "max_tokens": np.ones_like([[prompt]]).astype(np.int32) * 100,
              "stream": np.array([[streaming]], dtype=bool), "beam_width": np.array([[1]], dtype=np.int32),
              "temperature": np.array([[1.0]], dtype=np.float32)}
    if bad_words:
        inputs["bad_words"] = np.array([list(bad_words)], dtype=object)
    if stop_words:
        inputs["stop_words"] = np.array([list(stop_words)], dtype=object)
    if log_probs:
        inputs["return_log_probs"] = np.array([[True]], dtype=bool)
    inputs["exclude_input_in_output"] = np.array([[exclude]], dtype=bool)
    return inputs


@pytest.mark.parametrize("streaming", [False, True], ids=["unary-response", "streaming"])
@pytest.mark.parametrize("exclude", [False, True], ids=["echo", "exclude-input"])
def test_end_to_end_grpc_client_reads_its_text(echo_server, streaming: bool, exclude: bool) -> None:
    """Its --check-outputs rule: non-streaming output without --exclude-input-in-output is the
    prompt followed by the output; streaming concatenates each response's text_output[0]."""
    prompt = "alpha beta gamma delta"
    results = _stream_like_end_to_end_client(echo_server.grpc_url, "tokenrouter", _end_to_end_inputs(
        prompt, streaming=streaming, exclude=exclude, stop_words=["delta"], bad_words=["zeta"]), ["text_output"])
    assert results and not [r for r in results if isinstance(r, Exception)], results
    texts = [r.as_numpy("text_output")[0].decode("utf-8") for r in results]
    batch_index = results[0].as_numpy("batch_index")
    assert batch_index is None or batch_index[0][0] == 0
    generated = prompt  # the double echoes up to and including the stop word
    if streaming:
        assert "".join(texts) == generated
    else:
        assert texts == [generated if exclude else prompt + generated]


def test_end_to_end_grpc_client_with_log_probs_and_batch_inputs(echo_server) -> None:
    """--return-log-probs asks for cum_log_probs and output_log_probs; --batch-inputs stacks rows and
    reads batch_index[0][0] from every response."""
    rows = [_end_to_end_inputs(p, streaming=True, log_probs=True) for p in ("one two", "three four five")]
    batch = {name: np.concatenate([row[name] for row in rows]) for name in rows[0]}
    results = _stream_like_end_to_end_client(echo_server.grpc_url, "tokenrouter", batch,
                                             ["text_output", "cum_log_probs", "output_log_probs", "batch_index"])
    texts = ["", ""]
    for result in results:
        texts[result.as_numpy("batch_index")[0][0]] += result.as_numpy("text_output")[0].decode()
        assert result.as_numpy("output_log_probs").shape[:2] == (1, 1)
        assert result.as_numpy("cum_log_probs").shape == (1, 1)
    assert texts == ["one two", "three four five"]


def _llama_index_inputs(prompt: str) -> list[grpcclient.InferInput]:
    """GrpcTritonClient._generate_inputs() with NvidiaTriton's defaults (tokens 100, top_k 1.0 cast
    to INT32, top_p 0, temperature 1.0, penalties 1.0, beam_width 1, stream true)."""
    arrays = {"text_input": np.array([[prompt]]).astype(object),
              "max_tokens": np.array([100]).astype(np.int32).reshape((1, -1)),
              "top_k": np.array([1.0]).astype(np.int32).reshape((1, -1)),
              "top_p": np.array([0]).astype(np.float32).reshape((1, -1)),
              "temperature": np.array([1.0]).astype(np.float32).reshape((1, -1)),
              "length_penalty": np.array([1.0]).astype(np.float32).reshape((1, -1)),
              "repetition_penalty": np.array([1.0]).astype(np.float32).reshape((1, -1)),
              "random_seed": np.array([42]).astype(np.uint64).reshape((1, -1)),
              "beam_width": np.array([1]).astype(np.int32).reshape((1, -1)),
              "stream": np.array([[True]], dtype=bool)}
    return [_tensor(n, a) for n, a in arrays.items()]


def test_llama_index_stream_complete_with_its_defaults(echo_server) -> None:
    """Its stream callback joins token.decode() over text_output (which fails on a [1, 1] array) and
    ends at the final flag; afterwards it sends tensorrt_llm's stop inputs to the same model, which
    is refused, and stops the stream: the request must still end and the refusal stay harmless."""
    prompt = "alpha beta gamma"
    tokens: queue.Queue = queue.Queue()

    def callback(result, error):
        if error:
            tokens.put(error)
            return
        raw = result.get_response(as_json=True)
        if "outputs" in raw:
            tokens.put("".join(token.decode() for token in result.as_numpy("text_output")))
        if raw["parameters"]["triton_final_response"]["bool_param"]:
            tokens.put(None)

    client = grpcclient.InferenceServerClient(echo_server.grpc_url)
    client.start_stream(callback=callback)
    client.async_stream_infer(model_name="tokenrouter", inputs=_llama_index_inputs(prompt),
                              outputs=[grpcclient.InferRequestedOutput("text_output")], request_id="7")
    text = ""
    while (token := tokens.get(timeout=60)) is not None:
        assert not isinstance(token, Exception), token
        text += token
    stop = {"input_ids": np.empty([1, 1], dtype=np.int32), "input_lengths": np.zeros([1, 1], dtype=np.int32),
            "request_output_len": np.array([[0]], dtype=np.uint32), "stop": np.array([[True]], dtype="bool")}
    client.async_stream_infer("tokenrouter", [_tensor(n, a) for n, a in stop.items()], request_id="7",
                              parameters={"Streaming": True})
    client.stop_stream()
    client.close()
    assert text == prompt
    refusal = tokens.get(timeout=10)
    assert "unexpected inference input" in str(refusal)  # tensorrt_llm's inputs: not a front's


# --- Triton's OpenAI frontend ---------------------------------------------------------------------
# Written from triton-inference-server/server python/openai/openai_frontend/engine (main, 2026-08):
# _create_trtllm_generate_request builds these tensors, in-process, for "an ensemble, a python or BLS
# model"; usage comes from num_input_tokens (read once) and num_output_tokens (added up over a stream).
# That frontend needs Triton >= 2.52's Python bindings; here its requests go over gRPC instead.
OPENAI_DEFAULT_MAX_TOKENS = 16  # its --default-max-tokens
CHAT_PROMPT = "<|im_start|>user\nalpha beta gamma delta<|im_end|>\n<|im_start|>assistant\n"  # as it renders


def _openai_frontend_inputs(prompt: str, *, stream: bool, echo: bool | None = None, **sampling) -> dict:
    """Its request: text_input and stream always, max_tokens (its default when the client sends none),
    the sampling fields the client set, the echo tensor only for completions, both count flags."""
    inputs = {"text_input": np.array([[prompt]], dtype=object), "stream": np.bool_([[stream]]),
              "max_tokens": np.int32([[sampling.pop("max_tokens", OPENAI_DEFAULT_MAX_TOKENS)]])}
    if "stop" in sampling:
        inputs["stop_words"] = np.array([sampling.pop("stop")], dtype=object)
    casts = {"top_p": np.float32, "frequency_penalty": np.float32, "presence_penalty": np.float32,
             "seed": np.uint64, "temperature": np.float32}
    inputs.update({name: casts[name]([[value]]) for name, value in sampling.items()})
    if echo is not None:  # CreateCompletionRequest has echo; a chat request does not
        inputs["exclude_input_in_output"] = np.bool_([[not echo]])
    inputs["return_num_input_tokens"] = np.bool_([[True]])
    inputs["return_num_output_tokens"] = np.bool_([[True]])
    return inputs


def _openai_frontend_call(url: str, model: str, inputs: dict) -> list[Reply]:
    """Every response with outputs, up to the final one (its async_infer iterates to the final flag)."""
    stream = GrpcStream(url)
    try:
        return stream.request(inputs, model)
    finally:
        stream.close()


def _usage(replies: list[Reply]) -> tuple[int, int]:
    """_StreamingUsageAccumulator's reading: prompt tokens from the first response, completion tokens summed."""
    return (int(replies[0]["num_input_tokens"].reshape(-1)[0]),
            sum(int(reply["num_output_tokens"].reshape(-1)[0]) for reply in replies))


def test_openai_frontend_chat_gets_the_reply_alone_with_its_usage(echo_server, codec) -> None:
    """Non-streaming chat, as that frontend sends it (no exclude_input_in_output): on a front rendered
    with frontend.exclude_input_in_output the reply is the output alone, and the counts are the
    prompt's tokens and the output's. A default front echoes the prompt, as TensorRT-LLM's does."""
    inputs = _openai_frontend_inputs(CHAT_PROMPT, stream=False, temperature=0.0, seed=7, top_p=1.0)
    (reply,) = _openai_frontend_call(echo_server.grpc_url, OPENAI_FRONT, inputs)
    prompt_ids = codec.encode_prompt(CHAT_PROMPT)
    output = reply.text  # the double's output is the prompt's first tokens (up to an end id)
    assert reply.ids and reply.ids == prompt_ids[:len(reply.ids)] and output == codec.decode(reply.ids)
    assert _usage([reply]) == (len(prompt_ids), len(reply.ids))
    (echoed,) = _openai_frontend_call(echo_server.grpc_url, "tokenrouter", inputs)
    assert echoed.text == codec.decode(prompt_ids) + output


def test_openai_frontend_streamed_chat_adds_up_to_the_whole(echo_server, codec) -> None:
    """Streaming chat: the deltas join to the non-streamed text, num_output_tokens summed over the
    responses is the output's length (a cumulative count would overstate it), finish_reason last."""
    replies = _openai_frontend_call(echo_server.grpc_url, OPENAI_FRONT,
                                    _openai_frontend_inputs(CHAT_PROMPT, stream=True, max_tokens=9))
    assert len(replies) > 1
    ids = [token for reply in replies for token in reply.ids]
    assert "".join(reply.text for reply in replies) == codec.decode(ids)
    assert _usage(replies) == (len(codec.encode_prompt(CHAT_PROMPT)), len(ids)) and len(ids) == 9
    assert [reply.finish_reason for reply in replies][-2:] == ["", "length"]


@pytest.mark.parametrize("front", ["tokenrouter", UNARY, OPENAI_FRONT])
@pytest.mark.parametrize("echo", [False, True], ids=["completion", "echo"])
def test_openai_frontend_completion_echo_on_every_front(echo_server, codec, front: str, echo: bool) -> None:
    """A completion sends exclude_input_in_output = not echo, which every front honours whatever its
    default; a stop string (with its space: BPE tokens carry it) ends it, kept; counts as for chat. The unary front
    answers the same request through ModelInfer."""
    prompt = "alpha beta gamma delta epsilon"
    inputs = _openai_frontend_inputs(prompt, stream=False, echo=echo, stop=[" gamma"], frequency_penalty=0.0,
                                     presence_penalty=0.0)
    (reply,) = ([grpc_infer(echo_server.grpc_url, inputs, front)] if front == UNARY
                else _openai_frontend_call(echo_server.grpc_url, front, inputs))
    assert reply.text == (prompt if echo else "") + "alpha beta gamma"
    assert _usage([reply]) == (len(codec.encode_prompt(prompt)), len(codec.encode_prompt("alpha beta gamma")))
    assert reply.finish_reason == "stop"


def test_counts_are_answered_only_when_asked(echo_server) -> None:
    """Without the two flags the responses carry neither count (TensorRT-LLM's behaviour)."""
    inputs = _openai_frontend_inputs("alpha beta", stream=False)
    del inputs["return_num_input_tokens"], inputs["return_num_output_tokens"]
    (reply,) = _openai_frontend_call(echo_server.grpc_url, "tokenrouter", inputs)
    assert "num_input_tokens" not in reply and "num_output_tokens" not in reply


@pytest.mark.parametrize(("front", "apply", "shown"), [
    (CHAT_FRONT, None, "user\nhi there"),  # the front's chat_template: wrapped (the echo stops at <|im_end|>)
    (CHAT_FRONT, False, "hi there"),  # a prompt rendered already (our OpenAI server's): sent as is
    ("tokenrouter", True, "user\nhi there"),
    ("tokenrouter", None, "hi there"),
])
def test_apply_chat_template_overrides_the_front_setting(echo_server, front: str, apply: bool | None,
                                                         shown: str) -> None:
    inputs = _openai_frontend_inputs("hi there", stream=False, echo=False)
    if apply is not None:
        inputs["apply_chat_template"] = np.bool_([[apply]])
    (reply,) = _openai_frontend_call(echo_server.grpc_url, front, inputs)
    assert reply.text == shown
