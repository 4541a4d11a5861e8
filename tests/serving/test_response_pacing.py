"""The response writer's pacing: a stream's first token and its final response go out at once;
between them its responses are at least the interval apart, and what it produced meanwhile leaves
as one response, each token in its place with its model. Other streams and errors are untouched."""

from __future__ import annotations

import pytest

from tokenrouter.serving.subserver.output_chunk import OutputChunk
from tokenrouter.serving.subserver.pacing import Pacer, QueuedChunk, QueuedError

INTERVAL = 0.05


def data(rid: str, tokens: list[int], models: list[str], prefix: list[int], reason: str | None = None,
         share: float = 0.0) -> QueuedChunk:
    chunk = OutputChunk(list(tokens), [m.encode() for m in models], list(prefix), reason, share, [])
    return QueuedChunk(rid, f"sender-{rid}", chunk)


def feed(pacer: Pacer, *items) -> list:
    out = []
    for item in items:
        out += pacer.add(item)
    return out


def test_the_first_token_goes_out_at_once_and_later_ones_wait_for_the_interval() -> None:
    pacer = Pacer()
    assert feed(pacer, data("a", [1], ["slm"], [9, 8])) == []
    first = pacer.due(10.0, INTERVAL)
    assert [i.chunk.tokens for i in first] == [[1]]
    assert feed(pacer, data("a", [2], ["llm"], [9, 8, 1]), data("a", [3], ["slm"], [9, 8, 1, 2], share=0.5)) == []
    assert pacer.due(10.0 + INTERVAL / 2, INTERVAL) == []  # too soon: held
    assert pacer.next_due(10.0 + INTERVAL / 2, INTERVAL) == pytest.approx(INTERVAL / 2)
    later = pacer.due(10.0 + INTERVAL, INTERVAL)
    assert len(later) == 1
    chunk = later[0].chunk
    # one response, in order, each token with its model, decoded after the prefix of its first token
    assert (chunk.tokens, chunk.origins, chunk.prefix) == ([2, 3], [b"llm", b"slm"], [9, 8, 1])
    assert chunk.large_share == 0.5 and not later[0].final
    assert pacer.next_due(10.0 + INTERVAL, INTERVAL) is None


def test_a_final_chunk_goes_out_at_once_with_what_was_held() -> None:
    pacer = Pacer()
    feed(pacer, data("a", [1], ["slm"], []))
    pacer.due(0.0, INTERVAL)
    feed(pacer, data("a", [2], ["slm"], [1]), data("a", [3], ["llm"], [1, 2], "length", share=1 / 3))
    out = pacer.due(0.001, INTERVAL)
    assert [(i.chunk.tokens, i.chunk.origins, i.final) for i in out] == [([2, 3], [b"slm", b"llm"], True)]
    tensors = out[0].chunk.tensors()
    assert tensors["output_ids"].tolist() == [[2, 3]] and tensors["is_final"].tolist() == [[True]]
    assert tensors["finish_reason"].tolist() == [[b"length"]] and tensors["prefix_ids"].tolist() == [[1]]
    feed(pacer, data("a", [7], ["slm"], []))  # the same id again is a new stream: its first token is not held
    assert [i.chunk.tokens for i in pacer.due(0.002, INTERVAL)] == [[7]]


def test_streams_are_paced_apart_and_each_keeps_its_order() -> None:
    pacer = Pacer()
    feed(pacer, data("a", [1], ["slm"], []))
    assert [i.rid for i in pacer.due(0.0, INTERVAL)] == ["a"]
    feed(pacer, data("a", [2], ["slm"], [1]), data("b", [10], ["llm"], []), data("a", [3], ["llm"], [1, 2]),
         data("b", [11], ["slm"], [10]))
    out = pacer.due(0.01, INTERVAL)  # b's first response is due, a's second is not
    assert [(i.rid, i.chunk.tokens) for i in out] == [("b", [10, 11])]
    assert [(i.rid, i.chunk.tokens, i.chunk.origins) for i in pacer.due(0.05, INTERVAL)] == [
        ("a", [2, 3], [b"slm", b"llm"])]


def test_an_error_goes_out_at_once_after_the_output_held_before_it() -> None:
    pacer = Pacer()
    feed(pacer, data("a", [1], ["slm"], []))
    pacer.due(0.0, INTERVAL)
    error = QueuedError("a", "sender-a", "boom")
    out = feed(pacer, data("a", [2], ["slm"], [1]), error)
    assert [type(i).__name__ for i in out] == ["QueuedChunk", "QueuedError"] and out[0].chunk.tokens == [2]
    assert pacer.due(0.001, INTERVAL) == [] and pacer.next_due(0.001, INTERVAL) is None


def test_a_chunk_after_a_final_one_is_not_merged_into_it() -> None:
    pacer = Pacer()
    final = data("a", [1], ["slm"], [], "length")
    out = feed(pacer, final, data("a", [2], ["slm"], [1]))
    assert out == [final] and final.chunk.tokens == [1]  # sent on its own (and refused by Triton)
    assert [i.chunk.tokens for i in pacer.due(0.0, INTERVAL)] == [[2]]


def test_a_chunk_that_must_go_alone_is_never_held_nor_merged() -> None:
    """One token per response (a front under TensorRT-LLM's names asked for it): each chunk goes out
    at once, however soon after the last, and other streams keep their pacing."""
    pacer = Pacer()
    alone = [QueuedChunk("t", "sender-t", data("t", [n], ["slm"], []).chunk, alone=True) for n in (1, 2, 3)]
    assert feed(pacer, *alone) == alone  # all three at once, none merged
    assert feed(pacer, data("p", [1], ["slm"], []), data("p", [2], ["slm"], [1])) == []  # paced: held
    assert pacer.next_due(0.0, INTERVAL) is not None and all(item.rid == "p" for item in pacer.due(0.0, INTERVAL))


def test_the_sink_splits_a_run_of_tokens_into_one_response_each_when_asked() -> None:
    """A peer's run of tokens arrives at the entry at once; TensorRT-LLM's streaming sends each alone,
    the finish with the last; logprobs and the decoding prefix follow each token."""
    from tokenrouter.serving.subserver.triton_sink import TritonSink

    class Writer:
        def __init__(self) -> None:
            self.sent: list = []

        def respond(self, rid, sender, chunk, wanted, alone=False) -> None:
            self.sent.append((chunk, alone))

    for one_token, sizes in ((True, [1, 1, 1]), (False, [3])):
        writer = Writer()
        sink = TritonSink(writer, "r", "sender", True, ["slm", "llm"], 0, one_token=one_token)
        sink.on_output([5, 6, 7], [1, 1, 0], "length", logprobs=[-0.5, -0.25, -1.0])
        chunks = [chunk for chunk, _ in writer.sent]
        assert [len(c.tokens) for c in chunks] == sizes and all(alone == one_token for _, alone in writer.sent)
        assert [t for c in chunks for t in c.tokens] == [5, 6, 7]
        assert [o for c in chunks for o in c.origins] == [b"llm", b"llm", b"slm"]
        assert [p for c in chunks for p in c.logprobs] == [-0.5, -0.25, -1.0]
        assert [c.finish_reason for c in chunks] == [None] * (len(sizes) - 1) + ["length"]
        assert chunks[-1].prefix == ([5, 6] if one_token else [])
