"""The OpenAI server's reading of a front's gRPC responses, and its idle-stream pool, without a server."""

from __future__ import annotations

import asyncio

import numpy as np
from tritonclient.grpc import service_pb2
from tritonclient.utils import serialize_byte_tensor

from tokenrouter.openai_server.triton_stream import IdleStreams, _reply


def _response(outputs: dict[str, tuple[str, np.ndarray]], final: bool) -> service_pb2.ModelInferResponse:
    response = service_pb2.ModelInferResponse()
    response.parameters["triton_final_response"].bool_param = final
    for name, (datatype, array) in outputs.items():
        tensor = response.outputs.add()
        tensor.name, tensor.datatype = name, datatype
        tensor.shape.extend(array.shape)
        raw = serialize_byte_tensor(array).item() if datatype == "BYTES" else array.tobytes()
        response.raw_output_contents.append(raw)
    return response


def _text(value: str) -> tuple[str, np.ndarray]:
    return "BYTES", np.array([value.encode()], dtype=np.object_)


def test_a_reply_reads_strings_and_numbers_by_name() -> None:
    reply = _reply(_response({
        "text_output": _text("héllo"), "finish_reason": _text("length"),
        "num_output_tokens": ("INT32", np.array([9], dtype=np.int32)),
        "large_model_share": ("FP32", np.array([0.25], dtype=np.float32)),
        "num_input_tokens": ("INT32", np.array([4], dtype=np.int32)),
        "output_ids": ("INT32", np.array([5, 6], dtype=np.int32)),
        "output_log_probs": ("FP32", np.array([-0.5, -1.5], dtype=np.float32)),
    }, final=True))
    assert reply is not None
    assert (reply.text, reply.finish_reason, reply.large_share, reply.prompt_tokens, reply.final) == \
        ("héllo", "length", 0.25, 4, True)
    assert reply.tokens == 2  # with output_ids, their count (not num_output_tokens)
    assert reply.token_ids is not None and reply.token_ids.tolist() == [5, 6]
    assert reply.log_probs is not None and reply.log_probs.tolist() == [-0.5, -1.5]


def test_a_reply_without_ids_counts_num_output_tokens() -> None:
    reply = _reply(_response({
        "text_output": _text("ab"), "finish_reason": _text(""),
        "num_output_tokens": ("INT32", np.array([3], dtype=np.int32)),
        "large_model_share": ("FP32", np.array([0.0], dtype=np.float32)),
    }, final=False))
    assert reply is not None
    assert (reply.tokens, reply.prompt_tokens, reply.token_ids, reply.log_probs) == (3, None, None, None)


def test_an_empty_response_is_a_final_marker_or_nothing() -> None:
    final = _reply(_response({}, final=True))
    assert final is not None and final.final and final.text == "" and final.tokens == 0
    assert _reply(_response({}, final=False)) is None


class _Call:
    def __init__(self) -> None:
        self.cancelled = False

    def done(self) -> bool:
        return self.cancelled

    def cancel(self) -> None:
        self.cancelled = True


def test_idle_streams_hand_back_the_last_kept_and_expire_the_rest() -> None:
    errors: list[dict] = []

    async def scenario() -> None:
        # a timer left running on a taken call fires into an entry that is gone: an error in the loop
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: errors.append(context))
        pool = IdleStreams(idle_s=0.05)
        old, new = _Call(), _Call()
        pool.keep("front", old)
        pool.keep("front", new)
        assert pool.take("front") is new and not new.cancelled  # taken: its expiry timer is off
        await asyncio.sleep(0.15)
        assert old.cancelled and len(pool) == 0 and pool.take("front") is None
        assert not new.cancelled
        pool.keep("front", new)
        pool.close()
        assert new.cancelled and len(pool) == 0

    asyncio.run(scenario())
    assert errors == []
