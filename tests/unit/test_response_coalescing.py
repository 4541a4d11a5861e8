"""The response writer's rounds: a request's chunks queued while the writer was busy leave as one
response, each token in its place with its model; other requests' chunks and errors are untouched."""

from __future__ import annotations

from tokenrouter.serving.responses import Chunk, _Data, _Error, coalesce


def data(rid: str, tokens: list[int], models: list[str], prefix: list[int], reason: str | None = None,
         share: float = 0.0) -> _Data:
    return _Data(rid, f"sender-{rid}", Chunk(list(tokens), [m.encode() for m in models], list(prefix), reason, share))


def test_one_requests_chunks_merge_in_order_under_the_first_prefix() -> None:
    out = coalesce([data("a", [1], ["slm"], [9, 8]), data("a", [2, 3], ["llm", "slm"], [8, 1], share=0.3),
                    data("a", [4], ["slm"], [1, 2, 3], "length", share=0.25)])
    assert len(out) == 1
    chunk = out[0].chunk
    assert (chunk.tokens, chunk.origins, chunk.prefix) == ([1, 2, 3, 4], [b"slm", b"llm", b"slm", b"slm"], [9, 8])
    assert chunk.finish_reason == "length" and chunk.large_share == 0.25 and out[0].final
    tensors = chunk.tensors()
    assert tensors["output_ids"].tolist() == [1, 2, 3, 4] and tensors["is_final"].tolist() == [True]
    assert tensors["output_models"].tolist() == [b"slm", b"llm", b"slm", b"slm"]


def test_interleaved_requests_each_keep_their_own_order() -> None:
    items = [data("a", [1], ["slm"], []), data("b", [10], ["llm"], []), data("a", [2], ["slm"], [1]),
             data("b", [11], ["slm"], [10], "eos"), data("a", [3], ["llm"], [1, 2])]
    out = coalesce(items)
    assert [(i.rid, i.chunk.tokens) for i in out] == [("a", [1, 2, 3]), ("b", [10, 11])]
    assert out[0].chunk.origins == [b"slm", b"slm", b"llm"] and not out[0].final and out[1].final


def test_nothing_merges_across_an_error_or_after_a_final_chunk() -> None:
    error = _Error("a", "sender-a", "boom")
    out = coalesce([data("a", [1], ["slm"], []), error, data("a", [2], ["slm"], [1])])
    assert [type(i).__name__ for i in out] == ["_Data", "_Error", "_Data"]
    assert out[0].chunk.tokens == [1] and out[2].chunk.tokens == [2]
    out = coalesce([data("a", [1], ["slm"], [], "length"), data("a", [2], ["slm"], [1])])
    assert [i.chunk.tokens for i in out] == [[1], [2]]  # a late chunk is sent (and refused) on its own


def test_a_lone_chunk_is_sent_as_it_came() -> None:
    item = data("a", [5], ["slm"], [4])
    assert coalesce([item]) == [item] and coalesce([]) == []
