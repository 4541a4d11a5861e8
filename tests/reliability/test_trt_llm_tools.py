"""TensorRT-LLM's token-level tools against the served tiny pair, each reproduced without its code.

The tools (tensorrtllm_backend c2e65b88, read there; their code stays outside the project) drive
``tensorrt_llm``, ``preprocessing`` and ``postprocessing`` with TensorRT-LLM's own tensors. Each
test below sends what one code path of one tool sends (names, dtypes, shapes, the same client calls
and flags) and checks its answers the way that tool reads them; each docstring names the tool and
the path. The unary paths go to ``tensorrt_llm_unary`` and ``unary``, unary twins of
``tensorrt_llm`` and the front (helpers/servers.py), as the tools' unary modes need a repository
rendered with ``frontend.decoupled: false``; one server serves both modes here.

Greedy ids through ``tensorrt_llm`` equal the ``tokenrouter`` front's for the same prompt, and so do
the models that wrote them; what has no meaning here is refused by name (core_request.py).
"""

from __future__ import annotations

import queue
import time
from functools import partial

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from helpers.servers import UNARY, UNARY_CORE
from helpers.routing import PROMPTS, metrics, wait_for_idle_pools
from helpers.cancellation import assert_cancelled_and_idle, wait_until_held
from tokenrouter.client import grpc_stream, inputs
from tokenrouter.text import TextCodec

CORE = "tensorrt_llm"


@pytest.fixture(scope="module")
def codec(tiny_pair) -> TextCodec:
    return TextCodec.from_path(tiny_pair["small"])


def prepare_tensor(module, name: str, array: np.ndarray):
    """The tools' ``prepare_tensor``: an InferInput of the array's own shape and dtype."""
    tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array)
    return tensor


def front_greedy(server, prompt: str, max_tokens: int, sequences: int = 1) -> dict[int, tuple[list[int], list[str]]]:
    """The ``tokenrouter`` front's greedy ids and models for ``prompt`` (its defaults: greedy), by
    sequence (each sequence has its own seed, which the routing policy may draw on)."""
    replies = grpc_stream(server.grpc_url, inputs(text_input=prompt, max_tokens=max_tokens, stream=True,
                                                  num_return_sequences=sequences))
    by_sequence = {}
    for n in range(sequences):
        mine = [r for r in replies if r["sequence_index"][0][0] == n]
        by_sequence[n] = [i for r in mine for i in r.ids], [m for r in mine for m in r.models]
    return by_sequence


# --- inflight_batcher_llm/client/inflight_batcher_llm_client.py -----------------------------------
def client_inputs(ids: list[int], codec: TextCodec, output_len: int, **flags) -> list:
    """Its ``prepare_inputs`` with its defaults (beam_width 1, temperature 1.0, top_k 1, top_p 0.0) and
    ``--tokenizer-dir``'s end and pad ids (the tokenizer's eos; pad = eos when it has none); the optional
    inputs only when their flag is given, as it adds them."""
    tokenizer = codec.tokenizer
    eos = tokenizer.eos_token_id
    pad = eos if tokenizer.pad_token_id is None else tokenizer.pad_token_id
    arrays = {"input_ids": np.array([ids], np.int32), "input_lengths": np.array([[len(ids)]], np.int32),
              "request_output_len": np.array([[output_len]], np.int32), "beam_width": np.array([[1]], np.int32),
              "temperature": np.array([[1.0]], np.float32),
              "streaming": np.array([[flags.get("streaming", False)]], bool),
              "end_id": np.array([[eos]], np.int32), "pad_id": np.array([[pad]], np.int32),
              "runtime_top_k": np.array([[1]], np.int32), "runtime_top_p": np.array([[0.0]], np.float32)}
    if "num_return_sequences" in flags:
        arrays["num_return_sequences"] = np.array([[flags["num_return_sequences"]]], np.int32)
    for flag in ("return_log_probs", "exclude_input_in_output"):
        if flags.get(flag):
            arrays[flag] = np.array([[True]], bool)
    return [prepare_tensor(grpcclient, name, array) for name, array in arrays.items()]


@pytest.mark.parametrize("flags", [{}, {"return_log_probs": True, "exclude_input_in_output": True,
                                        "num_return_sequences": 2}],
                         ids=["plain", "log-probs-excluded-input-two-sequences"])
def test_inflight_batcher_client_streaming_equals_the_front(routing_server, codec, flags):
    """``inflight_batcher_llm_client.py --streaming --tokenizer-dir ...`` (also with ``--return-log-probs
    --exclude-input-in-output -n 2``): ``start_stream``, one ``async_stream_infer`` to ``tensorrt_llm``,
    ``stop_stream``; it appends ``output_ids[0][0]`` of each response whose ``sequence_length[0][0] > 0``
    to the sequence ``sequence_index`` names. Its greedy ids are the front's, token for token, and so are
    the models that wrote them (sequence by sequence: each has its seed)."""
    prompt, output_len = PROMPTS[0], 16
    ids = codec.encode_prompt(prompt)
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(routing_server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        client.async_stream_infer(CORE, client_inputs(ids, codec, output_len, streaming=True, **flags),
                                  request_id="7")
        client.stop_stream()
    count = flags.get("num_return_sequences", 1)
    sequences: dict[int, list[int]] = {n: [] for n in range(count)}
    models: dict[int, list[str]] = {n: [] for n in range(count)}
    log_probs = []
    while not answers.empty():
        result = answers.get()
        assert not isinstance(result, InferenceServerException), result
        sequence = int(result.as_numpy("sequence_index")[0][0])
        assert result.as_numpy("output_ids").ndim == 3 and result.get_response().id == "7"
        if result.as_numpy("sequence_length")[0][0] > 0:
            sequences[sequence] += list(result.as_numpy("output_ids")[0][0])
            models[sequence] += [m.decode() for m in result.as_numpy("output_models")[0]]
        if flags.get("return_log_probs") and sequence == 0:
            log_probs += result.as_numpy("output_log_probs")[0][0].tolist()
            cum = float(result.as_numpy("cum_log_probs")[0][0])
    expected = front_greedy(routing_server, prompt, output_len, count)
    assert all(len(tokens) == output_len for tokens, _ in expected.values())
    assert {n: (sequences[n], models[n]) for n in range(count)} == expected
    if flags.get("return_log_probs"):
        assert len(log_probs) == output_len and cum == pytest.approx(sum(log_probs), abs=1e-3)


def test_a_stream_with_empty_final_responses_ends_with_the_final_flag(routing_server, codec):
    """The gRPC stream flag ``enable_empty_final_response`` (what Triton's genai-perf and perf_analyzer
    set): every token arrives, and the stream's last response says ``triton_final_response``, once."""
    ids = codec.encode_prompt(PROMPTS[5])
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(routing_server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        client.async_stream_infer(CORE, client_inputs(ids, codec, 10, streaming=True), request_id="1",
                                  enable_empty_final_response=True)
        client.stop_stream()
    results = list(answers.queue)
    assert not any(isinstance(r, InferenceServerException) for r in results), results
    finals = [r.get_response().parameters["triton_final_response"].bool_param for r in results]
    assert finals.count(True) == 1 and finals[-1]
    tokens = [t for r in results if r.as_numpy("output_ids") is not None for t in r.as_numpy("output_ids")[0][0]]
    assert tokens == front_greedy(routing_server, PROMPTS[5], 10)[0][0]


def test_inflight_batcher_client_non_streaming_equals_the_front(routing_server, codec):
    """``inflight_batcher_llm_client.py --tokenizer-dir ...`` without ``--streaming``: one ``async_infer``
    with ``parameters={'Streaming': False}`` and a callback; ``output_ids[0][0]`` is the prompt and the
    generated ids (it cuts the prompt off itself), ``sequence_length[0][0]`` their count."""
    prompt, output_len = PROMPTS[1], 12
    ids = codec.encode_prompt(prompt)
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(routing_server.grpc_url) as client:
        client.async_infer(UNARY_CORE, client_inputs(ids, codec, output_len), request_id="",
                           callback=lambda result, error: answers.put(error or result),
                           parameters={"Streaming": False})
        result = answers.get(timeout=120)
    assert not isinstance(result, InferenceServerException), result
    output = list(result.as_numpy("output_ids")[0][0])
    assert result.as_numpy("sequence_length")[0][0] == len(output) == len(ids) + output_len
    assert output == ids + front_greedy(routing_server, prompt, output_len)[0][0]


def test_inflight_batcher_client_refusals_name_the_input(routing_server, codec):
    """Its ``--beam-width 2``, ``--draft-tokens-csv`` and ``--lora-task-id`` paths: refused, naming the input."""
    ids = codec.encode_prompt(PROMPTS[2])
    cases = {"beam_width": (np.array([[2]], np.int32), "beam_width 2: only 1 is accepted"),
             "draft_input_ids": (np.array([[5, 6]], np.int32), "draft_input_ids: draft-model speculative"),
             "lora_task_id": (np.array([[3]], np.uint64), "lora_task_id: LoRA adapters are not supported")}
    for name, (array, message) in cases.items():
        request = [t for t in client_inputs(ids, codec, 4) if t.name() != name] + [
            prepare_tensor(grpcclient, name, array)]
        with pytest.raises(InferenceServerException, match=message):
            grpcclient.InferenceServerClient(routing_server.grpc_url).infer(UNARY_CORE, request)


# --- tools/inflight_batcher_llm/benchmark_core_model.py -----------------------------------------------
def benchmark_requests(codec: TextCodec, count: int) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """Its ``dataset`` workload: each prompt tokenized (``[1, n]`` INT32 ids, ``[[n]]`` lengths) with
    an output length."""
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(count)]
    return [(np.array([codec.encode_prompt(p)], np.int32), np.array([[len(codec.encode_prompt(p))]], np.int32),
             8 + i % 5) for i, p in enumerate(prompts)]


def benchmark_inputs(module, ids: np.ndarray, lengths: np.ndarray, output_len: int) -> list:
    """Its request: input_ids, input_lengths, request_output_len, then pad_id 0 and end_id 1 (its
    ``append_pad_id_to_tensors`` / ``append_end_id_to_tensors`` without ids given)."""
    return [prepare_tensor(module, "input_ids", ids), prepare_tensor(module, "input_lengths", lengths),
            prepare_tensor(module, "request_output_len", np.ones_like([[1]]).astype(np.int32) * output_len),
            prepare_tensor(module, "pad_id", np.ones_like([[1]]).astype(np.int32) * 0),
            prepare_tensor(module, "end_id", np.ones_like([[1]]).astype(np.int32) * 1)]


def check_benchmark_results(results: list, requests: list) -> None:
    """What its ``extract_print_stats`` reads (over gRPC; over HTTP it reads nothing, checked the same
    here): per request id, ``outputs[0]['shape'][2]`` of the JSON response, less the input length
    (``--exclude-input-in-output`` not given) > 0."""
    assert len(results) == len(requests)
    for result in results:
        grpc = isinstance(result, grpcclient.InferResult)
        response = result.get_response(as_json=True) if grpc else result.get_response()
        ids, lengths, output_len = requests[int(response["id"])]
        assert response["outputs"][0]["name"] == "output_ids"
        assert 0 < int(response["outputs"][0]["shape"][2]) - int(lengths[0][0]) <= output_len


def test_benchmark_core_model_decoupled_grpc(routing_server, codec):
    """``benchmark_core_model.py -i grpc --decoupled dataset ...``: 10 warm-up requests of the first
    prompt with request_output_len 100 on one stream (callback ignores them), ``stop_stream``; then every
    request on a new stream, request ids "0".., ``stop_stream``, and its ``get_grpc_results``: one
    result per request, none an error."""
    requests = benchmark_requests(codec, 12)
    with grpcclient.InferenceServerClient(routing_server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: None)
        for i in range(10):
            client.async_stream_infer(CORE, benchmark_inputs(grpcclient, requests[0][0], requests[0][1], 100),
                                      request_id=str(i))
        client.stop_stream()
        results = stream_results(client, requests)
    check_benchmark_results(results, requests)


def stream_results(client: grpcclient.InferenceServerClient, requests: list) -> list:
    """Its decoupled gRPC run: every request on a new stream (request ids "0"..), ``stop_stream``, then
    ``get_grpc_results``: one result per request, none an error."""
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    for i, request in enumerate(requests):
        client.async_stream_infer(CORE, benchmark_inputs(grpcclient, *request), request_id=str(i))
    client.stop_stream()
    return [checked_answer(answers, 5) for _ in requests]


def async_infer_results(client: grpcclient.InferenceServerClient, requests: list) -> list:
    """Its unary gRPC run: ``async_infer`` per request with a callback, against a unary core model."""
    answers: queue.Queue = queue.Queue()
    for i, request in enumerate(requests):
        client.async_infer(UNARY_CORE, benchmark_inputs(grpcclient, *request), request_id=str(i),
                           callback=partial(lambda q, result, error: q.put((result, error)), answers))
    return [checked_answer(answers, 120) for _ in requests]


def checked_answer(answers: queue.Queue, timeout_s: float):
    result, error = answers.get(timeout=timeout_s)
    assert error is None, error
    return result


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_benchmark_core_model_unary(routing_server, codec, protocol):
    """``benchmark_core_model.py -i grpc|http dataset ...`` without ``--decoupled``: 10 blocking
    ``infer`` warm-ups, then ``async_infer`` per request (gRPC with a callback, HTTP futures read by
    ``get_result``), against a unary core model."""
    requests = benchmark_requests(codec, 8)
    module = grpcclient if protocol == "grpc" else httpclient
    url = routing_server.grpc_url if protocol == "grpc" else routing_server.http_url
    client = module.InferenceServerClient(url, **({} if protocol == "grpc" else {"concurrency": 128}))
    try:
        for i in range(10):
            client.infer(UNARY_CORE, benchmark_inputs(module, requests[0][0], requests[0][1], 100), request_id=str(i))
        if protocol == "http":
            futures = [client.async_infer(UNARY_CORE, benchmark_inputs(module, *r), request_id=str(i))
                       for i, r in enumerate(requests)]
            results = [future.get_result() for future in futures]
        else:
            results = async_infer_results(client, requests)
    finally:
        client.close()
    check_benchmark_results(results, requests)


def synthetic_requests(count: int) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """Its ``token-norm-dist`` workload: input and output lengths from normal distributions (at least 1),
    each prompt ``[1, n]`` INT32 ids drawn uniformly from [0, 2**31 - 1) (its utils ``gen_random_start_ids``),
    nearly all past any vocabulary; seeded here so a failure repeats."""
    rng = np.random.default_rng(420)
    lengths = [max(1, int(np.ceil(x))) for x in rng.normal(24, 8, count)]
    return [(rng.integers(0, np.iinfo(np.int32).max, size=(1, n), dtype=np.int32), np.array([[n]], np.int32),
             max(1, int(np.ceil(out)))) for n, out in zip(lengths, rng.normal(8, 2, count))]


def check_wrapped_prompts(results: list, requests: list, vocab: int) -> None:
    """Beyond what the tool reads: each output starts with its prompt folded into the vocabulary (frontend
    ``out_of_vocabulary_ids: wrap``, the reliability server's setting), every id of it a vocabulary id."""
    for result in results:
        ids, lengths, _ = requests[int(result.get_response().id)]
        output = result.as_numpy("output_ids")[0][0]
        assert output[:lengths[0][0]].tolist() == (ids[0] % vocab).tolist()
        assert ((0 <= output) & (output < vocab)).all()


def test_benchmark_core_model_token_norm_dist_decoupled_grpc(routing_server, codec):
    """``benchmark_core_model.py -i grpc --decoupled token-norm-dist ...``: random ids as the prompts, sent
    as its dataset path sends them (one stream, request ids "0"..); answered with ``wrap`` on."""
    requests = synthetic_requests(4)
    with grpcclient.InferenceServerClient(routing_server.grpc_url) as client:
        results = stream_results(client, requests)
    check_benchmark_results(results, requests)
    check_wrapped_prompts(results, requests, len(codec.tokenizer))


def test_benchmark_core_model_token_norm_dist_unary_grpc(routing_server, codec):
    """``benchmark_core_model.py -i grpc token-norm-dist ...`` without ``--decoupled``: ``async_infer`` per
    request against a unary core model; a negative id (never sent by the tool) is still refused by name."""
    requests = synthetic_requests(3)
    with grpcclient.InferenceServerClient(routing_server.grpc_url) as client:
        results = async_infer_results(client, requests)
        with pytest.raises(InferenceServerException, match="input_ids holds id -1, outside the vocabulary"):
            client.infer(UNARY_CORE, benchmark_inputs(grpcclient, np.array([[5, -1]], np.int32),
                                                      np.array([[2]], np.int32), 4))
    check_benchmark_results(results, requests)
    check_wrapped_prompts(results, requests, len(codec.tokenizer))


# --- tools/inflight_batcher_llm/identity_test.py (its last version, removed before c2e65b88) ----------
def test_identity_test_requests(routing_server, codec):
    """Its ``test_performance``: unary ``infer`` of input_ids, input_lengths and request_output_len alone.
    It sends request_output_len as UINT32, which TensorRT-LLM's own config (INT32) refuses too: Triton
    answers that, naming the input; with INT32 the same request is served."""
    ids = np.array([codec.encode_prompt(PROMPTS[3])], np.int32)
    lengths = np.array([[ids.shape[1]]], np.int32)
    with grpcclient.InferenceServerClient(routing_server.grpc_url) as client:
        uint32 = [prepare_tensor(grpcclient, "input_ids", ids), prepare_tensor(grpcclient, "input_lengths", lengths),
                  prepare_tensor(grpcclient, "request_output_len", np.ones_like([[1]]).astype(np.uint32) * 6)]
        with pytest.raises(InferenceServerException, match="request_output_len"):
            client.infer(UNARY_CORE, uint32)
        int32 = uint32[:2] + [prepare_tensor(grpcclient, "request_output_len", np.array([[6]], np.int32))]
        result = client.infer(UNARY_CORE, int32, request_id="0")
    assert result.as_numpy("sequence_length")[0][0] == ids.shape[1] + 6


# --- tools/inflight_batcher_llm/end_to_end_test.py, test_functionality_ifb -----------------------------
@pytest.mark.parametrize("protocol, log_probs", [("http", False), ("grpc", True)])
def test_end_to_end_chain_by_hand_equals_the_ensemble(routing_server, protocol, log_probs):
    """Its first step, unary ``infer`` calls: ``preprocessing`` (QUERY [[prompt]], BAD_WORDS_DICT and
    STOP_WORDS_DICT [[""]], REQUEST_OUTPUT_LEN) -> ``tensorrt_llm`` (INPUT_ID, DECODER_INPUT_ID,
    REQUEST_INPUT_LEN, REQUEST_OUTPUT_LEN, OUT_END_ID, OUT_PAD_ID as input_ids, decoder_input_ids, ...)
    -> ``postprocessing`` (output_ids as TOKENS_BATCH, sequence_length as SEQUENCE_LENGTH); then the
    ensemble with text_input, max_tokens, bad_words, stop_words; OUTPUT == text_output (and with
    ``--return-log-probs`` the same cum_log_probs and output_log_probs)."""
    module = grpcclient if protocol == "grpc" else httpclient
    url = routing_server.grpc_url if protocol == "grpc" else routing_server.http_url
    client = module.InferenceServerClient(url)
    try:
        for i, prompt in enumerate(PROMPTS[:3]):
            query, output_len = np.array([[prompt]]).astype(object), np.ones_like([[prompt]]).astype(np.int32) * 10
            empty = np.array([[""]], dtype=object)
            result = client.infer("preprocessing", [
                prepare_tensor(module, "QUERY", query), prepare_tensor(module, "BAD_WORDS_DICT", empty),
                prepare_tensor(module, "STOP_WORDS_DICT", empty),
                prepare_tensor(module, "REQUEST_OUTPUT_LEN", output_len)], request_id=str(i))
            core_inputs = [prepare_tensor(module, name, result.as_numpy(source)) for name, source in (
                ("input_ids", "INPUT_ID"), ("decoder_input_ids", "DECODER_INPUT_ID"),
                ("input_lengths", "REQUEST_INPUT_LEN"), ("request_output_len", "REQUEST_OUTPUT_LEN"),
                ("end_id", "OUT_END_ID"), ("pad_id", "OUT_PAD_ID"))]
            flag = [prepare_tensor(module, "return_log_probs", np.array([[True]], dtype=bool))] if log_probs else []
            result = client.infer(UNARY_CORE, core_inputs + flag, request_id=str(i))
            tokens, lengths = result.as_numpy("output_ids").astype(np.int32), result.as_numpy("sequence_length")
            core_log_probs = (result.as_numpy("cum_log_probs"), result.as_numpy("output_log_probs"))
            result = client.infer("postprocessing", [prepare_tensor(module, "TOKENS_BATCH", tokens),
                                                     prepare_tensor(module, "SEQUENCE_LENGTH", lengths)],
                                  request_id=str(i))
            by_hand = result.as_numpy("OUTPUT")
            ensemble = client.infer(UNARY, [
                prepare_tensor(module, "text_input", query), prepare_tensor(module, "max_tokens", output_len),
                prepare_tensor(module, "bad_words", empty), prepare_tensor(module, "stop_words", empty)] + flag,
                request_id=str(i))
            assert by_hand == ensemble.as_numpy("text_output") and by_hand[0].decode().startswith(prompt)
            if log_probs:
                assert core_log_probs[0] == ensemble.as_numpy("cum_log_probs")
                assert (core_log_probs[1] == ensemble.as_numpy("output_log_probs")).all()
    finally:
        client.close()


# --- cancellation, as for the fronts --------------------------------------------------------------------
def test_a_cancelled_core_model_stream_ends_on_every_model(routing_server, codec):
    """``inflight_batcher_llm_client.py --streaming --stop-after-ms ... --stop-via-request-cancel``:
    ``stop_stream(cancel_requests=True)`` while 4 long requests run: all end as cancelled, pools idle."""
    assert wait_for_idle_pools(routing_server) == {}
    before = metrics(routing_server)
    ids = codec.encode_prompt(PROMPTS[4])
    clients = []
    for i in range(4):
        client = grpcclient.InferenceServerClient(routing_server.grpc_url)
        first: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error, q=first: q.put(error or result))
        request = client_inputs(ids, codec, 400, streaming=True) + [
            prepare_tensor(grpcclient, "min_tokens", np.array([[400]], np.int32))]
        client.async_stream_infer(CORE, request, request_id=str(i))
        assert not isinstance(first.get(timeout=120), InferenceServerException)
        clients.append(client)
    wait_until_held(routing_server, 4)
    since = time.monotonic()
    for client in clients:
        client.stop_stream(cancel_requests=True)
        client.close()
    assert_cancelled_and_idle(routing_server, before, 4, since)


def test_a_stop_request_ends_a_core_model_stream_on_every_model(routing_server, codec):
    """``inflight_batcher_llm_client.py --streaming --stop-after-ms ...`` (without ``--stop-via-request-cancel``):
    after the first tokens it sends its ``prepare_stop_signals`` request (input_ids ``np.empty([1, 1])``,
    input_lengths 0, request_output_len 0, ``stop`` true) with the same request id on the same stream, with
    ``parameters={'Streaming': True}``. The request ends as cancelled on every model, with fewer tokens than
    asked; the stop request gets an empty answer (the tool prints "Got cancellation response")."""
    assert wait_for_idle_pools(routing_server) == {}
    before = metrics(routing_server)
    ids = codec.encode_prompt(PROMPTS[4])
    answers: queue.Queue = queue.Queue()
    stop = [grpcclient.InferInput(name, [1, 1], datatype) for name, datatype in (
        ("input_ids", "INT32"), ("input_lengths", "INT32"), ("request_output_len", "INT32"), ("stop", "BOOL"))]
    for tensor, array in zip(stop, (np.empty([1, 1], dtype=np.int32), np.zeros([1, 1], dtype=np.int32),
                                    np.array([[0]], dtype=np.int32), np.array([[True]], dtype="bool"))):
        tensor.set_data_from_numpy(array)
    with grpcclient.InferenceServerClient(routing_server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        request = client_inputs(ids, codec, 400, streaming=True) + [
            prepare_tensor(grpcclient, "min_tokens", np.array([[400]], np.int32))]  # cannot end on its own first
        client.async_stream_infer(CORE, request, request_id="stop-me")
        first = answers.get(timeout=120)
        since = time.monotonic()
        client.async_stream_infer(CORE, stop, request_id="stop-me", parameters={"Streaming": True})
        assert_cancelled_and_idle(routing_server, before, 1, since)
        client.stop_stream()
    results = [first, *answers.queue]
    assert not any(isinstance(r, InferenceServerException) for r in results), results
    tokens = [t for r in results if r.as_numpy("output_ids") is not None for t in r.as_numpy("output_ids")[0][0]]
    assert 0 < len(tokens) < 400
    assert any(r.as_numpy("output_ids") is None for r in results)  # the stop request's empty answer


# --- benchmark_core_model.py --tensorrt-llm-model-name slm: two models on one stream ---------------------
def test_core_model_and_subserver_requests_in_turn_on_one_stream(routing_server):
    """``benchmark_core_model.py --decoupled -i grpc --tensorrt-llm-model-name slm`` keeps its default
    ``tensorrt_llm`` and adds ``slm``: core-model requests to both in turn on one stream. Triton 2.51
    aborted when a non-decoupled write (its own answer for an unknown model) met a decoupled one on a
    stream (docs/reliability.md); both are decoupled here, so ``tensorrt_llm`` answers and ``slm``'s
    refusal (Triton's: the core inputs are not the subserver's) takes the decoupled path on the same
    stream, 10 streams of 20, and the server stays up."""
    rng = np.random.default_rng(0)
    for _ in range(10):
        answers: queue.Queue = queue.Queue()
        with grpcclient.InferenceServerClient(routing_server.grpc_url) as client:
            client.start_stream(callback=lambda result, error: answers.put(error or result))
            for i in range(20):
                length = int(rng.integers(4, 32))
                ids = rng.integers(0, 100, size=(1, length)).astype(np.int32)
                request = benchmark_inputs(grpcclient, ids, np.array([[length]], np.int32), 2)
                client.async_stream_infer([CORE, "slm"][i % 2], request, request_id=str(i))
            client.stop_stream()
        errors = [str(a) for a in list(answers.queue) if isinstance(a, InferenceServerException)]
        served = [a for a in list(answers.queue) if not isinstance(a, InferenceServerException)]
        assert len(served) == 10 and len(errors) == 10, errors[:2]
        assert all("unexpected inference input 'pad_id' for model 'slm'" in e for e in errors), errors[:2]
    assert routing_server.process.poll() is None, routing_server.log_tail()
