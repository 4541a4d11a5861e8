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

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype


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
