"""The fan-out limits a config sets (``frontend.max_return_sequences``, ``max_generations``,
``max_words``) are the ones the fronts and the OpenAI server enforce, without a server: a config that
lowers them is rendered, the front reads its own config.pbtxt parameters back as Triton hands them to
it, and each bound refuses one past it (naming the limit) and takes the value at it. The defaults
(16, 64, 1024) are held by test_model_control.py against a real server."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from helpers.routing import routing_config
from tokenrouter.config import load_config
from tokenrouter.openai_server.errors import OpenAIError
from tokenrouter.openai_server.requests import limit_choices
from tokenrouter.openai_server.served import ServedPair
from tokenrouter.request_builder import RequestError
from tokenrouter.serving.front.front_request import FanOutLimits, parse_request
from tokenrouter.serving.repository import model_parameters, render_repository
from tokenrouter.serving.schema import CLIENT_INPUTS
from tokenrouter.serving.text.text_inputs import TextInputs
from tokenrouter.text import TextCodec

SEQUENCES, GENERATIONS, WORDS = 3, 5, 7  # each well under its default


@pytest.fixture(scope="module")
def repository(tiny_pair: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    raw = routing_config(tiny_pair)
    raw["frontend"] = {"max_return_sequences": SEQUENCES, "max_generations": GENERATIONS, "max_words": WORDS}
    return render_repository(load_config(raw), tmp_path_factory.mktemp("limits") / "repo")


@pytest.fixture(scope="module")
def front(repository: Path, tiny_pair: dict[str, Path]) -> tuple[TextInputs, FanOutLimits]:
    parameters = model_parameters(repository / "tokenrouter")
    return TextInputs(TextCodec.from_path(tiny_pair["small"]), str(tiny_pair["small"]), parameters), \
        FanOutLimits.from_parameters(parameters)


def rows(count: int, **values) -> dict[str, np.ndarray]:
    one = {name: CLIENT_INPUTS[name].row(value) for name, value in {"text_input": b"def f(x):", **values}.items()}
    return {name: np.repeat(array, count, axis=0) for name, array in one.items()}


def parse(front, inputs):
    text, limits = front
    return parse_request(inputs, text, decoupled=True, limits=limits)


def test_num_return_sequences_is_bounded_by_the_configs_limit(front) -> None:
    assert len(parse(front, rows(1, num_return_sequences=SEQUENCES))) == SEQUENCES
    with pytest.raises(RequestError, match=f"num_return_sequences {SEQUENCES + 1} is over the limit of {SEQUENCES}"):
        parse(front, rows(1, num_return_sequences=SEQUENCES + 1))


def test_rows_times_sequences_is_bounded_by_the_configs_limit(front) -> None:
    assert len(parse(front, rows(GENERATIONS))) == GENERATIONS
    with pytest.raises(RequestError, match=f"the limit per request is {GENERATIONS}"):
        parse(front, rows(GENERATIONS + 1))


@pytest.mark.parametrize("name", ["stop_words", "bad_words"])
def test_words_per_row_are_bounded_by_the_configs_limit(front, name: str) -> None:
    assert parse(front, rows(1, **{name: [b"x"] * WORDS}))
    with pytest.raises(RequestError, match=f"{name} holds {WORDS + 1} words; the limit is {WORDS}"):
        parse(front, rows(1, **{name: [b"x"] * (WORDS + 1)}))


def test_the_openai_servers_n_is_bounded_by_the_same_config(repository: Path) -> None:
    served = ServedPair.from_repository(repository)
    assert (served.max_choices, served.max_generations) == (SEQUENCES, GENERATIONS)
    limit_choices(SEQUENCES, 1, served.max_choices, served.max_generations)
    with pytest.raises(OpenAIError, match=f"n {SEQUENCES + 1} is over the limit of {SEQUENCES}"):
        limit_choices(SEQUENCES + 1, 1, served.max_choices, served.max_generations)
    with pytest.raises(OpenAIError, match=f"the limit is {GENERATIONS}"):
        limit_choices(2, 3, served.max_choices, served.max_generations)
