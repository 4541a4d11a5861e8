"""One request builder: a request built by a front, by the entry subserver's intake or by the
embedded API gets its missing fields from request_builder.py, and the docs say the same default.

What would break it: a path that builds its RequestSpec by hand with a default of its own (the
Python API once defaulted ``max_tokens`` to 128 where a front used 16).
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from fake_pb_utils import peer_sessions

from tokenrouter.protocol import RequestSpec
from tokenrouter.request_builder import DEFAULT_MAX_TOKENS, TENSORRT_LLM_SAMPLING_DEFAULTS, build_spec
from tokenrouter.runtime.api import TokenRouter
from tokenrouter.serving.front.front_request import parse_request
from tokenrouter.serving.subserver.intake import SubserverIntake
from tokenrouter.serving.text.text_inputs import TextInputs
from tokenrouter.text import TextCodec

ROOT = Path(__file__).resolve().parents[1]
SPEC_DEFAULTS = RequestSpec(prompt_len=0, max_tokens=1)  # RequestSpec's own field defaults


def test_a_field_not_sent_takes_the_given_default_then_the_builders() -> None:
    spec = build_spec(3, {"top_k": 5, "seed": 9}, defaults={"temperature": 1.0, "top_k": 0},
                      end_ids=(2,), stop_sequences=((4, 5),), logit_bias=[[7, -1.0]])
    assert spec.max_tokens == DEFAULT_MAX_TOKENS
    assert (spec.temperature, spec.top_k, spec.seed, spec.top_p) == (1.0, 5, 9, SPEC_DEFAULTS.top_p)
    assert (spec.end_ids, spec.stop_sequences, spec.logit_bias) == ([2], [[4, 5]], [(7, -1.0)])
    assert build_spec(3, {"max_tokens": 40}).max_tokens == 40


def test_a_front_request_without_sampling_inputs_reads_tensorrt_llms_defaults(tiny_pair: dict[str, Path]) -> None:
    text = TextInputs(TextCodec.from_path(tiny_pair["small"]), str(tiny_pair["small"]), {})
    [generation] = parse_request({"text_input": np.array([[b"def f(x):"]], dtype=np.object_)}, text, decoupled=True)
    spec = generation.spec
    assert spec.max_tokens == DEFAULT_MAX_TOKENS
    # stated here, not read from the constant under test: TensorRT-LLM samples with temperature 1, top_k
    # and top_p off when a client sends none of them
    assert (spec.temperature, spec.top_k, spec.top_p) == (1.0, 0, 0.0)
    assert set(TENSORRT_LLM_SAMPLING_DEFAULTS) == {"temperature", "top_k", "top_p"}


def test_an_entry_request_without_sampling_inputs_gets_the_same_max_tokens() -> None:
    inputs = {"input_ids": np.array([[5, 6, 7]], dtype=np.int32)}
    pb = SimpleNamespace(get_input_tensor_by_name=lambda request, name: (
        SimpleNamespace(as_numpy=lambda: inputs[name]) if name in inputs else None))
    intake = SubserverIntake(pb, subserver=None, writer=None, names=["slm"], secret="s", sessions=peer_sessions())
    spec = intake._spec(object(), prompt_len=3)
    assert spec.max_tokens == DEFAULT_MAX_TOKENS
    assert (spec.temperature, spec.top_p, spec.top_k) == (SPEC_DEFAULTS.temperature, SPEC_DEFAULTS.top_p,
                                                          SPEC_DEFAULTS.top_k)


@pytest.mark.parametrize("method", [TokenRouter.submit, TokenRouter.generate], ids=lambda m: m.__name__)
def test_the_embedded_api_defaults_max_tokens_the_same(method) -> None:
    assert inspect.signature(method).parameters["max_tokens"].default == DEFAULT_MAX_TOKENS


def test_the_docs_state_the_default() -> None:
    compatibility = (ROOT / "docs/compatibility.md").read_text()
    row = next(line for line in compatibility.splitlines() if line.startswith("| `max_tokens` | INT32"))
    assert re.search(rf"\b{DEFAULT_MAX_TOKENS} when missing", row), row
    readme = (ROOT / "README.md").read_text()
    assert f"| `max_tokens` | INT32 | [1] | default {DEFAULT_MAX_TOKENS} |" in readme
    runtime = (ROOT / "docs/runtime.md").read_text()
    assert f"`generate` takes `max_tokens` ({DEFAULT_MAX_TOKENS} when not given" in runtime
