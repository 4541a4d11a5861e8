"""Query-level routing: one model for the whole request, chosen once from the prompt."""

from __future__ import annotations

import pytest

from policy_builders import MODELS, flat, hidden_rows, peaked, roundtrip, step, view, write_head, route, send
from tokenrouter.policies import PolicyError, create_policy


def run_request(policy, first_logits, later_logits, *, prompt_len=3, hidden=None):
    """First step on the entry, then every later step on whichever model holds the request."""
    request = view("small", tokens=list(range(prompt_len)), prompt_len=prompt_len)
    out = step([request], [first_logits], hidden)
    holder = route(policy, [request], out)[0]
    if holder == "large":
        message = roundtrip(send(policy, request, "large"))
        assert message.tokens == list(range(prompt_len))  # the SLM's first token is dropped
        request = view("large", tokens=message.tokens, prompt_len=prompt_len, state=message.state)
    visited = [holder]
    for logits in later_logits:
        out = step([request], [logits], None if hidden is None else hidden[:1])
        visited.append(route(policy, [request], out)[0])
        request.token_ids.append(int(out.sampled[0]))
    return visited


def test_entropy_mode_decides_once_and_never_switches():
    policy = create_policy("query_level", MODELS, "small", {"mode": "entropy", "threshold": 0.3})
    # Confident start: the small model keeps the request even through later uncertain steps.
    assert run_request(policy, peaked(4), [flat(1), flat(2), peaked(3)]) == ["small"] * 4
    # Uncertain start: the large model takes it and keeps it through confident steps.
    assert run_request(policy, flat(4), [peaked(1), peaked(2), flat(3)]) == ["large"] * 4


def test_length_mode():
    policy = create_policy("query_level", MODELS, "small", {"mode": "length", "min_prompt_tokens": 10})
    assert run_request(policy, flat(1), [flat(1)] * 3, prompt_len=9) == ["small"] * 4
    assert run_request(policy, peaked(1), [peaked(1)] * 3, prompt_len=10) == ["large"] * 4


def test_classifier_mode_uses_a_trained_head_on_the_prompt(tmp_path):
    weights = write_head(tmp_path / "citer", "citer")
    policy = create_policy("query_level", MODELS, "small", {"mode": "classifier"}, weights=weights)
    assert policy.needs_hidden
    assert run_request(policy, peaked(1), [flat(1)] * 2, hidden=hidden_rows(+1.0)) == ["large"] * 3
    assert run_request(policy, flat(1), [flat(1)] * 2, hidden=hidden_rows(-1.0)) == ["small"] * 3


def test_batch_independence():
    policy = create_policy("query_level", MODELS, "small", {"mode": "entropy", "threshold": 0.3})
    batch = [view(rid=str(i)) for i in range(3)]
    logits = [peaked(1), flat(2), peaked(3, 2.0)]
    together = route(policy, batch, step(batch, logits))
    alone = [route(policy, [view()], step([view()], [row]))[0] for row in logits]
    assert together == alone


@pytest.mark.parametrize("params", [{"mode": "vibes"}, {"mode": "classifier", "classifier": "r2r"}])
def test_rejects_bad_params(params, tmp_path):
    with pytest.raises(PolicyError):
        create_policy("query_level", MODELS, "small", params, weights=write_head(tmp_path / "w", "citer"))


def test_classifier_mode_needs_weights():
    with pytest.raises(PolicyError, match="train-router"):
        create_policy("query_level", MODELS, "small", {"mode": "classifier"})
