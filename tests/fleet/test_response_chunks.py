"""The chunks a worker yields: each chunk's models, and the last one's usage, whole-response models and
large-model share, counted over every chunk (also when it carries no token: a cancelled request's end)."""

from __future__ import annotations

from tokenrouter.fleet.response_chunks import ResponseChunks


def test_the_last_chunk_counts_every_token_of_the_response() -> None:
    chunks = ResponseChunks(5, ["slm", "llm"], "slm")
    first = chunks.chunk([7, 8], [0, 1], [-0.1, -0.2], None)
    assert first == {"token_ids": [7, 8], "index": 0, "engine_data": {"models": ["slm", "llm"]},
                     "log_probs": [-0.1, -0.2]}
    last = chunks.chunk([9], [0], None, "length")
    assert last["finish_reason"] == "length" and "log_probs" not in last
    assert last["completion_usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    assert last["engine_data"]["models"] == ["slm"]
    assert last["engine_data"]["response_models"] == ["slm", "llm", "slm"]
    assert last["engine_data"]["large_model_share"] == 1 / 3


def test_an_end_without_tokens_still_carries_the_response_so_far() -> None:
    chunks = ResponseChunks(2, ["slm", "llm"], "slm")
    chunks.chunk([4], [1], None, None)
    end = chunks.chunk([], [], None, "cancelled")
    assert end["token_ids"] == [] and end["engine_data"]["models"] == []
    assert end["completion_usage"]["completion_tokens"] == 1 and end["engine_data"]["response_models"] == ["llm"]
    assert end["engine_data"]["large_model_share"] == 1.0
