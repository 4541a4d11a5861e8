"""Chunk detokenization: concatenated chunk texts equal decode(all ids), however cut: stateless (each
chunk with its prefix_ids, as postprocessing does) and in a front (which keeps its own tail)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from tokenrouter.protocol import RequestSpec
from tokenrouter.serving.front.front_outputs import GenerationOutput
from tokenrouter.serving.front.front_request import Generation
from tokenrouter.serving.schema import PREFIX_TOKENS
from tokenrouter.serving.text.detokenize import chunk_text, prefix_window
from tokenrouter.serving.text.entry_chunk import EntryChunk
from tokenrouter.text import TextCodec

REAL_TOKENIZER = Path(__file__).resolve().parents[2] / "engines/build/models/qwen2.5-coder-0.5b-instruct"
RARE = "𓀀"  # one character, several tokens in both tokenizers
TEXTS = [
    "plain ascii, nothing special",
    "héllo wörld — naïve café",
    "你好，世界。数据结构与算法",
    "emoji 🙂🚀👩‍💻 and flags 🇫🇷 mixed with code: print('ok')",
    f"rare: {RARE}{RARE} x{RARE}",
]


@pytest.fixture(scope="module", params=["tiny", "qwen2.5-coder"])
def codec(request: pytest.FixtureRequest, tiny_pair: dict[str, Path]) -> TextCodec:
    if request.param == "tiny":
        return TextCodec.from_path(tiny_pair["small"])
    if not (REAL_TOKENIZER / "tokenizer.json").is_file():
        pytest.skip("the real Qwen2.5-Coder tokenizer is not installed (tokenrouter models pull)")
    return TextCodec.from_path(REAL_TOKENIZER)


def stream(codec: TextCodec, ids: list[int], cuts: list[int]) -> list[str]:
    """Chunk texts of ``ids`` cut at ``cuts``, each computed alone as postprocessing does."""
    bounds = [0, *cuts, len(ids)]
    return [
        chunk_text(codec, prefix_window(ids, start), ids[start:end], is_final=end == len(ids))
        for start, end in zip(bounds, bounds[1:])
    ]


@pytest.mark.parametrize("text", TEXTS)
def test_token_by_token_stream_concatenates_to_the_decoded_text(codec: TextCodec, text: str) -> None:
    ids = codec.encode_prompt(text)
    chunks = stream(codec, ids, list(range(1, len(ids))))
    assert "".join(chunks) == codec.decode(ids) == text
    assert all("\ufffd" not in chunk for chunk in chunks)


@pytest.mark.parametrize("text", TEXTS)
def test_any_cut_of_the_stream_concatenates_to_the_decoded_text(codec: TextCodec, text: str) -> None:
    ids = codec.encode_prompt(text)
    rng = random.Random(text)
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(ids)), k=rng.randint(0, min(6, len(ids) - 1))))
        assert "".join(stream(codec, ids, cuts)) == text


def test_a_split_character_is_held_back_then_completed(codec: TextCodec) -> None:
    ids = codec.encode_prompt(RARE)
    assert len(ids) > 1, "the test needs a character spread over several tokens"
    assert chunk_text(codec, [], ids[:1], is_final=False) == ""
    assert chunk_text(codec, ids[:1], ids[1:], is_final=True) == RARE


def test_a_final_chunk_keeps_an_incomplete_character(codec: TextCodec) -> None:
    ids = codec.encode_prompt(RARE)
    assert chunk_text(codec, [], ids[:1], is_final=True) == codec.decode(ids[:1]) != ""


def test_prefix_window_holds_at_most_prefix_tokens() -> None:
    ids = list(range(20))
    assert prefix_window(ids, 0) == []
    assert prefix_window(ids, 3) == [0, 1, 2]
    assert prefix_window(ids, 20) == ids[-PREFIX_TOKENS:]


@pytest.mark.parametrize("text", TEXTS)
def test_a_front_without_prefix_ids_streams_the_same_text(codec: TextCodec, text: str) -> None:
    """A front keeps its generation's tail itself and asks the entry for no prefix_ids: its chunk
    texts must still concatenate to the decoded text, however the stream is cut. Catches a tail
    that is not kept (a split character would come out as U+FFFD or be lost)."""
    ids = codec.encode_prompt(text)
    rng = random.Random(text)
    for _ in range(10):
        cuts = sorted(rng.sample(range(1, len(ids)), k=rng.randint(0, min(6, len(ids) - 1))))
        bounds = [0, *cuts, len(ids)]
        output = GenerationOutput(codec, Generation(0, 0, [1], RequestSpec(prompt_len=1, max_tokens=len(ids)),
                                                    stream=True, echo_prompt=False))
        assert "prefix_ids" not in output.entry_outputs() and "output_log_probs" not in output.entry_outputs()
        texts = []
        for start, end in zip(bounds, bounds[1:]):
            chunk = EntryChunk(np.array(ids[start:end]), np.zeros(0), np.array([b"slm"] * (end - start)),
                               np.zeros(0), "length" if end == len(ids) else "", 0.0, end == len(ids))
            texts.append(output.response(chunk)["text_output"][0].decode())
        assert "".join(texts) == text
