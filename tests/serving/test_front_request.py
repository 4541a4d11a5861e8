"""The front's reading of TensorRT-LLM's inputs (front_request.py), without a server: every input of
the client interface is accepted into the field it sets, accepted only at its off value, or refused
naming it; the table in docs/compatibility.md says the same of each; and a generation's entry inputs
are read back by the entry subserver as the same request.

The cases come from the code's own tables (schema.CLIENT_INPUTS, front_request.REFUSED and OFF_ONLY),
so an input added to the interface without a case here, or a row in the docs, fails a test.
(tests/e2e/test_frontend.py sends the refusals and bad values through a real server.)
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fake_pb_utils import FakeRequest, fake_pb, peer_sessions
from helpers.generation import changes

from tokenrouter.request_builder import RequestError
from tokenrouter.serving.front.front_request import OFF_ONLY, REFUSED, SEED_RANGE, Generation, parse_request
from tokenrouter.serving.schema import CLIENT_INPUTS
from tokenrouter.serving.subserver.intake import SubserverIntake
from tokenrouter.serving.text.text_inputs import TextInputs
from tokenrouter.text import TextCodec

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "def f(x):"


@pytest.fixture(scope="module")
def text(tiny_pair: dict[str, Path]) -> TextInputs:
    return TextInputs(TextCodec.from_path(tiny_pair["small"]), str(tiny_pair["small"]), {})


def _encoded(value: Any) -> Any:
    if isinstance(value, list):
        return [_encoded(v) for v in value]
    return value.encode() if isinstance(value, str) else value


def request_inputs(**values: Any) -> dict[str, np.ndarray]:
    """One row of client inputs, each with its declared dtype (as Triton hands them to the front;
    strings as UTF-8 bytes)."""
    return {name: CLIENT_INPUTS[name].row(_encoded(value)) for name, value in {"text_input": PROMPT, **values}.items()}


def _words(text: TextInputs, *words: str) -> list[list[int]]:
    return text.codec.token_sequences(words)


# Each accepted input: (the values sent, as inputs with that name first) and the fields it changes
# from a request of text_input alone, one dict per generation; None: computed from the tokenizer.
ACCEPTED: dict[str, tuple[dict[str, Any], Any]] = {
    "text_input": ({"text_input": "return x"}, lambda t: [{"prompt_ids": t.codec.encode_prompt("return x"),
                                                           "spec.prompt_len": len(t.codec.encode_prompt("return x"))}]),
    "max_tokens": ({"max_tokens": 7}, [{"spec.max_tokens": 7}]),
    "num_return_sequences": ({"num_return_sequences": 3, "seed": 5},
                             [{"spec.seed": 5}, {"sequence": 1, "spec.seed": 6}, {"sequence": 2, "spec.seed": 7}]),
    "length_penalty": ({"length_penalty": 0.5}, [{}]),  # no effect without beams
    "temperature": ({"temperature": 0.5}, [{"spec.temperature": 0.5}]),
    "top_k": ({"top_k": 5}, [{"spec.top_k": 5}]),
    "top_p": ({"top_p": 0.75}, [{"spec.top_p": 0.75}]),
    "seed": ({"seed": 1234}, [{"spec.seed": 1234}]),
    "random_seed": ({"random_seed": 99}, [{"spec.seed": 99}]),
    "repetition_penalty": ({"repetition_penalty": 1.5}, [{"spec.repetition_penalty": 1.5}]),
    "presence_penalty": ({"presence_penalty": 0.5}, [{"spec.presence_penalty": 0.5}]),
    "frequency_penalty": ({"frequency_penalty": 0.25}, [{"spec.frequency_penalty": 0.25}]),
    "min_tokens": ({"min_tokens": 2}, [{"spec.min_tokens": 2}]),
    "return_log_probs": ({"return_log_probs": True}, [{"spec.return_log_probs": True}]),
    "end_id": ({"end_id": [5, 6]}, [{"spec.end_ids": [5, 6]}]),
    "pad_id": ({"pad_id": 3}, [{}]),  # no effect: responses are never padded
    "stop_words": ({"stop_words": ["return", ""]}, lambda t: [{"spec.stop_sequences": _words(t, "return")}]),
    "bad_words": ({"bad_words": ["pass"]}, lambda t: [{"spec.bad_sequences": _words(t, "pass")}]),
    "embedding_bias_words": ({"embedding_bias_words": ["pass"], "embedding_bias_weights": [-2.5]},
                             lambda t: [{"spec.logit_bias": [(token, -2.5) for token, in _words(t, "pass")]}]),
    "embedding_bias_weights": ({"embedding_bias_weights": [1.5], "embedding_bias_words": ["return"]},
                               lambda t: [{"spec.logit_bias": [(token, 1.5) for token, in _words(t, "return")]}]),
    "exclude_input_in_output": ({"exclude_input_in_output": True}, [{"echo_prompt": False}]),
    "return_num_input_tokens": ({"return_num_input_tokens": True}, [{"count_input": True}]),
    "return_num_output_tokens": ({"return_num_output_tokens": True}, [{"count_output": True}]),
    "apply_chat_template": ({"apply_chat_template": True},
                            lambda t: [{"prompt_ids": t.codec.encode_prompt(PROMPT, True),
                                        "spec.prompt_len": len(t.codec.encode_prompt(PROMPT, True))}]),
    "stream": ({"stream": True}, [{"stream": True, "echo_prompt": False}]),
}


def test_every_input_is_accepted_off_only_or_refused_and_has_a_case() -> None:
    """Catches an input of the interface that no case below covers (one added to the schema, or
    taken out of REFUSED or OFF_ONLY, would then be read as accepted without a test of what it sets)."""
    assert not set(REFUSED) & set(OFF_ONLY)
    assert set(REFUSED) | set(OFF_ONLY) <= set(CLIENT_INPUTS)
    assert set(ACCEPTED) == set(CLIENT_INPUTS) - set(REFUSED) - set(OFF_ONLY)


@pytest.fixture(scope="module")
def baseline(text: TextInputs) -> Generation:
    [generation] = parse_request(request_inputs(), text, decoupled=True)
    assert generation.prompt_ids == text.codec.encode_prompt(PROMPT)  # no chat template configured
    assert (generation.stream, generation.echo_prompt, generation.sequence) == (False, True, 0)
    return generation


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_an_accepted_input_sets_its_field_and_nothing_else(name: str, text: TextInputs, baseline: Generation) -> None:
    values, expected = ACCEPTED[name]
    assert next(iter(values)) == name
    generations = parse_request(request_inputs(**values), text, decoupled=True)
    assert changes(generations, baseline) == (expected(text) if callable(expected) else expected)


@pytest.mark.parametrize("name", sorted(OFF_ONLY))
def test_an_off_only_input_is_accepted_off_and_refused_on_naming_it(name: str, text: TextInputs,
                                                                     baseline: Generation) -> None:
    off, why = OFF_ONLY[name]
    assert changes(parse_request(request_inputs(**{name: off}), text, decoupled=True), baseline) == [{}]
    on = (not off) if isinstance(off, bool) else off + 1
    with pytest.raises(RequestError) as refused:
        parse_request(request_inputs(**{name: on}), text, decoupled=True)
    assert str(refused.value) == f"{name} {on!r}: only {off!r} is accepted; {why}"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_refused_input_is_refused_naming_it_whatever_its_value(name: str, text: TextInputs) -> None:
    tensor = CLIENT_INPUTS[name]
    neutral = np.zeros((1, *(1 if d == -1 else d for d in tensor.dims)), dtype=tensor.numpy)  # even 0 or ""
    with pytest.raises(RequestError) as refused:
        parse_request({**request_inputs(), name: neutral}, text, decoupled=True)
    assert str(refused.value) == f"{name}: {REFUSED[name]}"


# --- docs/compatibility.md, "Inputs" ---------------------------------------------------------------
DOCS_VALUES = {"false": False, "true": True, "0": 0, "1": 1}


def documented_rows() -> list[tuple[list[str], str]]:
    """The docs' input table: each row's input names and what it says of them ("here")."""
    page = (ROOT / "docs/compatibility.md").read_text()
    table = page.split("| input | dtype, dims | here |", 1)[1].split("\n\n", 1)[0]
    rows = []
    for line in table.strip().splitlines()[1:]:  # after the |---| line
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        rows.append((re.findall(r"`([^`]+)`", cells[0]), cells[2]))
    return rows


def test_the_docs_table_names_every_input_and_says_what_the_code_does() -> None:
    """Catches the docs and the code drifting apart: an input in one and not the other, refused in
    one and not the other, or accepted only at another off value ("1 accepted; anything else
    refused", "0 / false accepted; ..." for a row of two inputs)."""
    rows = documented_rows()
    assert sorted(name for names, _ in rows for name in names) == sorted(CLIENT_INPUTS)
    assert {name for names, here in rows if here.startswith("refused") for name in names} == set(REFUSED)
    off_only = {}
    for names, here in rows:
        if found := re.match(r"^(\S+)(?: / (\S+))? accepted; .*refused", here):
            values = [DOCS_VALUES[value] for value in found.groups() if value is not None]
            off_only.update(zip(names, values * len(names) if len(values) == 1 else values, strict=True))
    assert off_only == {name: off for name, (off, _) in OFF_ONLY.items()}


# --- what the front sends the entry ------------------------------------------------------------------
EVERY_ACCEPTED = dict(max_tokens=9, temperature=0.5, top_k=4, top_p=0.75, seed=2**64 - 1, repetition_penalty=1.25,
                      presence_penalty=0.5, frequency_penalty=-0.5, min_tokens=1, return_log_probs=True,
                      end_id=[7, 8], stop_words=["return", "pass"], bad_words=["x"],
                      embedding_bias_words=["return"], embedding_bias_weights=[2.0], stream=True,
                      num_return_sequences=2)


def test_the_entry_reads_back_the_request_the_front_built(text: TextInputs) -> None:
    """A generation's entry inputs, read by the entry subserver's intake, are the same request:
    catches an input the front fills under another name, in another shape, or not at all."""
    generations = parse_request(request_inputs(**EVERY_ACCEPTED), text, decoupled=True)
    assert [g.spec.seed for g in generations] == [SEED_RANGE - 1, 0]  # sequence i: seed + i, wrapped
    for generation in generations:
        entry = FakeRequest(generation.entry_inputs(), {})
        intake = SubserverIntake(fake_pb(), subserver=None, writer=None, names=["slm"], secret="s",
                                 sessions=peer_sessions())
        assert intake._spec(entry, prompt_len=len(generation.prompt_ids)) == generation.spec
        assert intake._flat(entry, "input_ids") == generation.prompt_ids
        assert intake._scalar(entry, "stream", None) is True


def test_a_unary_front_refuses_what_needs_several_responses(text: TextInputs) -> None:
    for values, message in ((dict(stream=True), "stream true needs a decoupled front"),
                            (dict(num_return_sequences=2), "num_return_sequences 2 needs a decoupled front")):
        with pytest.raises(RequestError, match=message):
            parse_request(request_inputs(**values), text, decoupled=False)
    two_rows = {name: np.concatenate([array, array]) for name, array in request_inputs().items()}
    with pytest.raises(RequestError, match="a batch of 2 rows needs a decoupled front"):
        parse_request(two_rows, text, decoupled=False)
    assert [(g.row, g.sequence) for g in parse_request(two_rows, text, decoupled=True)] == [(0, 0), (1, 0)]


@pytest.mark.parametrize("name, values, message", [
    ("end_id", {"end_id": np.ones(10**6, np.int32)}, "end_id holds 1000000 ids; the limit is 1024"),
    ("embedding_bias_weights", {"embedding_bias_words": [b"x"], "embedding_bias_weights": np.ones(10**6, np.float32)},
     "embedding_bias_weights holds 1000000 weights; the limit is 1024"),
])
def test_list_inputs_are_counted_against_max_words_before_they_are_read(name: str, values: dict, message: str,
                                                                         text: TextInputs) -> None:
    """10^6 end ids took a front 3.3 s to refuse: now counted against frontend.max_words first."""
    inputs = {**request_inputs(), **{k: np.asarray(v)[None] if isinstance(v, np.ndarray) else CLIENT_INPUTS[k].row(v)
                                     for k, v in values.items()}}
    start = time.perf_counter()
    with pytest.raises(RequestError, match=message):
        parse_request(inputs, text, decoupled=True)
    assert time.perf_counter() - start < 0.05
