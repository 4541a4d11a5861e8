"""tokenrouter.protocol is the leaf policies and the runtime share: neither package imports the
other (the assembly module, where config names become objects, is the one place that knows both)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tokenrouter.protocol import PeerMessage, RequestSpec, RequestView, decode_batch, encode_batch


def _modules_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(m for m in sys.modules if m.startswith('tokenrouter')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_protocol_imports_nothing_from_the_project():
    assert _modules_after("import tokenrouter.protocol") == {"tokenrouter", "tokenrouter.protocol"}


@pytest.mark.parametrize("package, forbidden", [
    ("tokenrouter.policies.builtin", "tokenrouter.runtime"),
    ("tokenrouter.runtime.subserver", "tokenrouter.policies"),
])
def test_policies_and_runtime_import_alone(package, forbidden):
    """Catches an import cycle coming back (policies.base importing runtime.messages while the
    runtime imports policies.base only worked while runtime/__init__.py stayed empty)."""
    loaded = _modules_after(f"import {package}")
    assert package in loaded
    assert not {m for m in loaded if m == forbidden or m.startswith(forbidden + ".")}


def test_peer_message_round_trips_with_explicit_keep_sampled():
    spec = RequestSpec(prompt_len=2, max_tokens=4, end_ids=[0], stop_sequences=[[1, 2]])
    message = PeerMessage(kind="handoff", rid="r", sender="a", anchor=0, tokens=[5, 6, 7], origins=[-1, -1, 0],
                          request=spec, state={"mix": {"ids": [1], "p": [0.5]}}, keep_sampled=True)
    (back,) = decode_batch(encode_batch([message]))
    assert back == message and back.keep_sampled and back.end == 3


def test_message_to_says_whether_the_sampled_token_travels():
    view = RequestView(rid="r", model="a", model_index=0, token_ids=[1, 2, 3], prompt_len=2, origins=[0],
                       spec=RequestSpec(prompt_len=2, max_tokens=4), known={"b": 2}, sampled_token=9)
    kept, dropped = view.message_to("b", keep_sampled=True), view.message_to("b", keep_sampled=False)
    assert (kept.anchor, kept.tokens, kept.origins, kept.keep_sampled) == (2, [3, 9], [0, 0], True)
    assert (dropped.tokens, dropped.keep_sampled, dropped.request) == ([3], False, None)
    unsampled = RequestView(rid="r", model="a", model_index=0, token_ids=[1, 2], prompt_len=2, origins=[],
                            spec=RequestSpec(prompt_len=2, max_tokens=4))
    assert not unsampled.message_to("b", keep_sampled=True).keep_sampled  # nothing sampled: nothing kept


def test_request_view_is_read_only():
    view = RequestView(rid="r", model="a", model_index=0, token_ids=[1, 2], prompt_len=2, origins=[],
                       spec=RequestSpec(prompt_len=2, max_tokens=4), state={"n": 1})
    with pytest.raises(AttributeError):
        view.token_ids.append(3)
    with pytest.raises(TypeError):
        view.state["n"] = 2
    with pytest.raises(AttributeError):
        view.sampled_token = 4


def test_request_spec_is_frozen():
    """A request's spec travels with its first handoff and is shared by every model's copy: a change
    on one would be a silent divergence, so none is allowed (a new spec is made with replace)."""
    spec = RequestSpec(prompt_len=2, max_tokens=4)
    with pytest.raises(AttributeError):
        spec.end_ids = [0]
