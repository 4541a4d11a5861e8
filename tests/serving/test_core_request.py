"""``tensorrt_llm``'s reading of TensorRT-LLM's core inputs (front/core_request.py) and its answers
(front/core_outputs.py), without a server: every input of the core model's config is accepted into
the field it sets, accepted only at its off value, or refused naming it; every list input is refused
by its shape before it is read; TensorRT-LLM's word-list layout reads back what preprocessing writes.

The cases come from the code's tables (schema.CORE_MODEL_INPUTS, CORE_REFUSED, CORE_OFF_ONLY), so
an input added to the core model without a case here fails a test.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fake_pb_utils import FakeRequest, fake_pb, peer_sessions
from helpers.generation import changes

from tokenrouter.protocol import RequestSpec
from tokenrouter.request_builder import RequestError
from tokenrouter.serving.front.core_outputs import CoreOutput
from tokenrouter.serving.front.core_request import CORE_OFF_ONLY, CORE_REFUSED, parse_core_request
from tokenrouter.serving.front.front_request import Generation
from tokenrouter.serving.schema import CORE_MODEL_INPUTS, word_list_rows, word_list_sequences
from tokenrouter.serving.subserver.intake import SubserverIntake
from tokenrouter.serving.text.entry_chunk import EntryChunk
from tokenrouter.serving.text.text_inputs import TextInputs
from tokenrouter.text import TextCodec

PROMPT = [5, 6, 7, 8]


@pytest.fixture(scope="module")
def text(tiny_pair: dict[str, Path]) -> TextInputs:
    return TextInputs(TextCodec.from_path(tiny_pair["small"]), str(tiny_pair["small"]), {"max_model_len": "64"})


def core_inputs(**values: Any) -> dict[str, np.ndarray]:
    """One row of core inputs as TensorRT-LLM's tools send them ([1, n] / [1, 1], the declared dtypes);
    word lists as [1, 2, n] arrays."""
    base = {"input_ids": PROMPT, "input_lengths": len(PROMPT), "request_output_len": 8}
    arrays = {}
    for name, value in {**base, **values}.items():
        tensor = CORE_MODEL_INPUTS[name]
        arrays[name] = np.asarray(value, dtype=tensor.numpy)[None] if len(tensor.dims) > 1 else tensor.row(value)
    return arrays


@pytest.fixture(scope="module")
def baseline(text: TextInputs) -> Generation:
    [generation] = parse_core_request(core_inputs(), text, decoupled=True)
    assert generation.prompt_ids == PROMPT and generation.spec.max_tokens == 8
    assert generation.spec.end_ids == text.default_end_ids  # no end_id: the model's, as a front's
    assert (generation.spec.top_k, generation.spec.top_p) == (0, 0.0)  # TensorRT-LLM's defaults: greedy
    assert (generation.stream, generation.echo_prompt) == (False, True)
    return generation


# Each accepted input (other than the three the baseline sends): the values sent and the fields changed
ACCEPTED: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {
    "num_return_sequences": ({"num_return_sequences": 2, "seed": 5},
                             [{"spec.seed": 5}, {"sequence": 1, "spec.seed": 6}]),
    "end_id": ({"end_id": 9}, [{"spec.end_ids": [9]}]),
    "pad_id": ({"pad_id": 3}, [{}]),  # no effect: responses are never padded
    "stop_words_list": ({"stop_words_list": [[11, 12, 13], [2, 3, -1]]}, [{"spec.stop_sequences": [[11, 12], [13]]}]),
    "bad_words_list": ({"bad_words_list": [[14, 0], [1, -1]]}, [{"spec.bad_sequences": [[14]]}]),
    "embedding_bias": ({"embedding_bias": [0.0, 0.0, -2.5, 0.0, 1.0]}, [{"spec.logit_bias": [(2, -2.5), (4, 1.0)]}]),
    "temperature": ({"temperature": 0.5}, [{"spec.temperature": 0.5}]),
    "runtime_top_k": ({"runtime_top_k": 5}, [{"spec.top_k": 5}]),
    "runtime_top_p": ({"runtime_top_p": 0.75}, [{"spec.top_p": 0.75}]),
    "len_penalty": ({"len_penalty": 0.5}, [{}]),  # no effect without beams
    "early_stopping": ({"early_stopping": True}, [{}]),  # beam search only
    "beam_search_diversity_rate": ({"beam_search_diversity_rate": 0.5}, [{}]),  # beam search only
    "repetition_penalty": ({"repetition_penalty": 1.5}, [{"spec.repetition_penalty": 1.5}]),
    "min_tokens": ({"min_tokens": 2}, [{"spec.min_tokens": 2}]),
    "min_length": ({"min_length": 3}, [{"spec.min_tokens": 3}]),
    "presence_penalty": ({"presence_penalty": 0.5}, [{"spec.presence_penalty": 0.5}]),
    "frequency_penalty": ({"frequency_penalty": 0.25}, [{"spec.frequency_penalty": 0.25}]),
    "seed": ({"seed": 1234}, [{"spec.seed": 1234}]),
    "random_seed": ({"random_seed": 99}, [{"spec.seed": 99}]),
    "return_log_probs": ({"return_log_probs": True}, [{"spec.return_log_probs": True}]),
    "exclude_input_in_output": ({"exclude_input_in_output": True}, [{"echo_prompt": False}]),
    "streaming": ({"streaming": True}, [{"stream": True, "echo_prompt": False}]),
    # encoder-decoder only; TensorRT-LLM's preprocessing sends the pad id for a decoder-only model
    "decoder_input_ids": ({"decoder_input_ids": [0]}, [{}]),
    "decoder_input_lengths": ({"decoder_input_lengths": 1}, [{}]),
}
SENT_BY_BASELINE = {"input_ids", "input_lengths", "request_output_len"}


def test_every_core_input_is_accepted_off_only_or_refused_and_has_a_case() -> None:
    assert not set(CORE_REFUSED) & set(CORE_OFF_ONLY)
    assert set(CORE_REFUSED) | set(CORE_OFF_ONLY) <= set(CORE_MODEL_INPUTS)
    assert set(ACCEPTED) == set(CORE_MODEL_INPUTS) - set(CORE_REFUSED) - set(CORE_OFF_ONLY) - SENT_BY_BASELINE


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_an_accepted_core_input_sets_its_field_and_nothing_else(name: str, text: TextInputs,
                                                                baseline: Generation) -> None:
    values, expected = ACCEPTED[name]
    assert next(iter(values)) == name
    assert changes(parse_core_request(core_inputs(**values), text, decoupled=True), baseline) == expected


@pytest.mark.parametrize("name", sorted(CORE_OFF_ONLY))
def test_an_off_only_core_input_is_refused_on_naming_it(name: str, text: TextInputs, baseline: Generation) -> None:
    off, why = CORE_OFF_ONLY[name]
    assert changes(parse_core_request(core_inputs(**{name: off}), text, decoupled=True), baseline) == [{}]
    on = (not off) if isinstance(off, bool) else off + 1
    with pytest.raises(RequestError, match=f"^{name} {on!r}: only {off!r} is accepted"):
        parse_core_request(core_inputs(**{name: on}), text, decoupled=True)


@pytest.mark.parametrize("name", sorted(CORE_REFUSED))
def test_a_refused_core_input_is_refused_naming_it(name: str, text: TextInputs) -> None:
    tensor = CORE_MODEL_INPUTS[name]
    neutral = np.zeros((1, *(1 if d == -1 else d for d in tensor.dims)), dtype=tensor.numpy)
    with pytest.raises(RequestError) as refused:
        parse_core_request({**core_inputs(), name: neutral}, text, decoupled=True)
    assert str(refused.value) == f"{name}: {CORE_REFUSED[name]}"


@pytest.mark.parametrize("values, message", [
    ({"input_lengths": 2}, None),  # the rest of the row is padding
    ({"input_lengths": 5}, r"input_lengths 5 must be in \[1, 4\]"),
    ({"input_ids": [5, 6, 10**7, 8]}, r"input_ids holds id 10000000, outside the vocabulary"),
    ({"runtime_top_p": 1.5}, r"top_p must be in \[0, 1\]"),
    ({"seed": 3, "random_seed": 4}, "random_seed 4 disagrees with the seed sent under another name"),
    ({"end_id": 10**7}, r"end_id \[10000000\] outside the vocabulary"),
    ({"stop_words_list": [[11, 12], [3, -1]]}, "stop_words_list: offset 3 goes back or past the 2 ids"),
    ({"embedding_bias": [float("nan")]}, "logit_bias weight for token 0 must be a number below"),
    ({"streaming": True}, "streaming true needs a decoupled tensorrt_llm"),
])
def test_core_values_are_checked_naming_the_input(values: dict, message: str | None, text: TextInputs) -> None:
    if message is None:
        [generation] = parse_core_request(core_inputs(**values), text, decoupled=True)
        assert generation.prompt_ids == PROMPT[:2]
        return
    with pytest.raises(RequestError, match=message):
        parse_core_request(core_inputs(**values), text, decoupled="streaming" not in values)


def test_out_of_vocabulary_ids_are_refused_by_default_and_folded_on_wrap(text: TextInputs) -> None:
    # benchmark_core_model.py's synthetic prompts: random ids in [0, 2**31 - 1), the padding past input_lengths too
    vocab = text.vocab_size
    ids = [5, vocab, 3 * vocab + 7, 2**31 - 2, 2**31 - 3]
    with pytest.raises(RequestError, match=f"^input_ids holds id {vocab}, outside the vocabulary"):
        parse_core_request(core_inputs(input_ids=ids, input_lengths=4), text, decoupled=True)
    [generation] = parse_core_request(core_inputs(input_ids=ids, input_lengths=4), text, decoupled=True, wrap_ids=True)
    assert generation.prompt_ids == [5, 0, 7, (2**31 - 2) % vocab]
    with pytest.raises(RequestError, match=r"^input_ids holds id -1, outside the vocabulary"):  # never wrapped
        parse_core_request(core_inputs(input_ids=[vocab, -1], input_lengths=2), text, decoupled=True, wrap_ids=True)


@pytest.mark.parametrize("name", ["input_ids", "input_lengths", "request_output_len"])
def test_the_three_required_inputs_are_named_when_missing(name: str, text: TextInputs) -> None:
    inputs = core_inputs()
    del inputs[name]
    with pytest.raises(RequestError, match=f"^{name} is missing"):
        parse_core_request(inputs, text, decoupled=True)


HUGE = 10**6


@pytest.mark.parametrize("name, array, message", [
    ("stop_words_list", np.zeros((1, 2, HUGE), np.int32), f"stop_words_list holds {HUGE} ids a row; the limit is"),
    ("bad_words_list", np.zeros((1, 2, HUGE), np.int32), f"bad_words_list holds {HUGE} ids a row"),
    ("input_ids", np.zeros((1, HUGE), np.int32), f"input_ids holds {HUGE} ids a row; the limit is 64"),
    ("embedding_bias", np.zeros((1, 4 * HUGE), np.float32), f"embedding_bias holds {4 * HUGE} values"),
    ("end_id", np.zeros((1, HUGE), np.int32), f"end_id must hold one value per row, got {HUGE}"),
    ("runtime_top_k", np.zeros((1, HUGE), np.int32), f"runtime_top_k must hold one value per row, got {HUGE}"),
])
def test_every_list_input_is_refused_by_its_shape_before_it_is_read(name: str, array: np.ndarray, message: str,
                                                                      text: TextInputs) -> None:
    """10^6 stop ids or end ids, 4M bias values: refused in well under a millisecond a request (a read of
    them as Python lists took seconds), with the limit named. Catches a bound that comes after a read."""
    inputs = {**core_inputs(), name: array}
    start = time.perf_counter()
    for _ in range(100):
        with pytest.raises(RequestError, match=message):
            parse_core_request(inputs, text, decoupled=True)
    assert (time.perf_counter() - start) / 100 < 0.005


def test_end_id_minus_one_means_no_end_id_and_the_entry_reads_it_so(text: TextInputs) -> None:
    """TensorRT-LLM's client sends end_id -1 when it has no tokenizer: the generation then ends by length."""
    [generation] = parse_core_request(core_inputs(end_id=-1), text, decoupled=True)
    assert generation.spec.end_ids == [-1]
    entry = FakeRequest(generation.entry_inputs(), {})
    intake = SubserverIntake(fake_pb(), subserver=None, writer=None, names=["slm"], secret="s",
                             sessions=peer_sessions())
    assert intake._spec(entry, prompt_len=len(PROMPT)) == generation.spec


def test_the_word_list_layout_reads_back_what_it_writes() -> None:
    rows = [[[1, 2], [3]], [], [[4, 5, 6]]]
    array = word_list_rows(rows)
    assert array.shape == (3, 2, 3) and array.dtype == np.int32
    assert array[0].tolist() == [[1, 2, 3], [2, 3, -1]] and array[1].tolist() == [[0, 0, 0], [-1, -1, -1]]
    assert [word_list_sequences(row) for row in array] == rows
    assert word_list_rows([[]]).tolist() == [[[0], [-1]]]  # TensorRT-LLM's "" words: one slot, no word


def _chunk(tokens: list[int], final: bool, logprobs: list[float] | None = None) -> EntryChunk:
    return EntryChunk(np.array(tokens), np.zeros(0), np.array([b"slm"] * len(tokens)),
                      np.array(logprobs or [], dtype=np.float32), "length" if final else "", 0.25, final)


def test_core_outputs_have_tensorrt_llms_shapes() -> None:
    spec = RequestSpec(prompt_len=2, max_tokens=3, return_log_probs=True)
    streamed = CoreOutput(Generation(1, 2, [40, 41], spec, stream=True, echo_prompt=False))
    first = streamed.response(_chunk([7, 8], False, [-0.5, -0.25]))
    last = streamed.response(_chunk([], True))
    assert first["output_ids"].tolist() == [[[7, 8]]] and first["sequence_length"].tolist() == [[2]]
    assert last["output_ids"].shape == (1, 1, 0) and last["sequence_length"].tolist() == [[0]]
    assert first["output_log_probs"].tolist() == [[[-0.5, -0.25]]] and last["cum_log_probs"].tolist() == [[-0.75]]
    assert (first["batch_index"].tolist(), first["sequence_index"].tolist()) == ([[1]], [[2]])
    assert last["finish_reason"].tolist() == [[b"length"]]
    whole = CoreOutput(Generation(0, 0, [40, 41], spec, stream=False, echo_prompt=True))
    assert whole.response(_chunk([7], False, [-1.0])) is None
    answer = whole.response(_chunk([8], True, [-2.0]))
    assert answer["output_ids"].tolist() == [[[40, 41, 7, 8]]] and answer["sequence_length"].tolist() == [[4]]
    assert answer["output_ids"].dtype == np.int32 and answer["output_models"].tolist() == [[b"slm", b"slm"]]
