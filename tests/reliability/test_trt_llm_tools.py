"""TensorRT-LLM's token-level tools get clear refusals and never take the server down.

``benchmark_core_model.py --decoupled --tensorrt-llm-model-name slm`` (tensorrtllm_backend,
tools/inflight_batcher_llm/) appends ``slm`` to its default model list, so it sends TensorRT-LLM
core-model requests (``input_ids``, ``input_lengths``, ``request_output_len``, ``pad_id``,
``end_id``) to ``tensorrt_llm`` and ``slm`` in turn on one gRPC stream: 10 to warm up, then the
benchmark's. With no model named ``tensorrt_llm``, Triton 2.51 answered those itself on the
non-decoupled write path while ``slm``'s refusals went out on the decoupled one, two writes at once
on one stream, and tritonserver aborted ("ASSERTION FAILED: !byte_buffer->Valid()"): 3 of 6 tool
runs, and this file's stream pattern within its first 2 streams in 3 of 3 tries. The same happens
for any non-decoupled model beside a decoupled one on a stream (postprocessing and slm: 1 in 30
streams of 50), which is Triton's, not ours; so the repository makes ``tensorrt_llm`` a decoupled
model that refuses (core_model.py). The tool itself is not run here (its code stays outside the
project); these streams send what it sends, the way it sends it.
"""

from __future__ import annotations

import queue

import numpy as np
import tritonclient.grpc as grpcclient

from e2e.test_routing_server import PROMPTS
from tokenrouter.client import http_generate

CORE_REFUSAL = "'tensorrt_llm' is TensorRT-LLM's core model"
SLM_REFUSAL = "unexpected inference input"


def _core_request(rng: np.random.Generator) -> list[grpcclient.InferInput]:
    """The tool's request: random prompt ids of a random length, as INT32 [1, n] / [1, 1] tensors."""
    length = int(rng.integers(4, 64))
    arrays = {"input_ids": rng.integers(0, 100, size=(1, length)), "input_lengths": [[length]],
              "request_output_len": [[int(rng.integers(8, 100))]], "pad_id": [[0]], "end_id": [[1]]}
    tensors = []
    for name, values in arrays.items():
        array = np.asarray(values, dtype=np.int32)
        tensors.append(grpcclient.InferInput(name, list(array.shape), "INT32"))
        tensors[-1].set_data_from_numpy(array)
    return tensors


def _stream(url: str, models: list[str], count: int, rng: np.random.Generator) -> list[str]:
    """``count`` requests to ``models`` in turn on one stream, sent without waiting, then the stream
    closed as the tool closes it (``stop_stream`` waits for every answer); the errors."""
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=lambda result, error: answers.put(error))
        for i in range(count):
            client.async_stream_infer(models[i % len(models)], _core_request(rng), request_id=str(i))
        client.stop_stream()
    finally:
        client.close()
    return [str(answers.get_nowait()) for _ in range(answers.qsize())]


def _assert_refused_each(errors: list[str], count: int) -> None:
    """Every request answered with its model's refusal (in any order: each model answers in its own time)."""
    assert len(errors) == count, errors[-3:]  # a dead server cut the stream short
    core = [e for e in errors if CORE_REFUSAL in e]
    slm = [e for e in errors if SLM_REFUSAL in e and "'slm'" in e]
    assert (len(core), len(slm)) == (count // 2, count // 2), errors


def _serves(server) -> None:
    assert server.process.poll() is None, f"tritonserver died:\n{server.log_tail()}"
    assert len(http_generate(server.http_url, {"text_input": PROMPTS[0], "max_tokens": 4})["output_ids"]) == 4


def test_core_model_requests_to_tensorrt_llm_and_slm_on_one_stream_many_times(routing_server):
    """The minimised request: core-model requests to ``tensorrt_llm`` and ``slm`` in turn on one
    stream, 50 a stream, 30 streams in a row."""
    rng = np.random.default_rng(0)
    for _ in range(30):
        _assert_refused_each(_stream(routing_server.grpc_url, ["tensorrt_llm", "slm"], 50, rng), 50)
    _serves(routing_server)


def test_the_core_model_benchmark_pattern_twenty_times(routing_server):
    """The tool's whole pattern, 20 runs: a stream of 10 warm-up requests, then one of the benchmark's."""
    rng = np.random.default_rng(1)
    for _ in range(20):
        _assert_refused_each(_stream(routing_server.grpc_url, ["tensorrt_llm", "slm"], 10, rng), 10)
        _assert_refused_each(_stream(routing_server.grpc_url, ["tensorrt_llm", "slm"], 40, rng), 40)
        assert routing_server.process.poll() is None, routing_server.log_tail()
    _serves(routing_server)
