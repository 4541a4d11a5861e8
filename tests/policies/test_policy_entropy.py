"""R-Stitch and GlimpRouter: entropy heuristics on constructed logits."""

from __future__ import annotations

import math

import pytest
import torch

from policy_builders import MODELS, flat, peaked, roundtrip, step, view, route, send
from tokenrouter.policies import PolicyError, create_policy
from tokenrouter.policies.r_stitch import normalized_entropy

NEWLINE = 7


def test_normalized_entropy_bounds():
    assert float(normalized_entropy(torch.zeros(1, 50))[0]) == pytest.approx(1.0)
    assert float(normalized_entropy(peaked(3)[None])[0]) < 1e-6
    two = torch.full((1, 4), -math.inf)
    two[0, :2] = 0.0
    assert float(normalized_entropy(two)[0]) == pytest.approx(0.5)


def test_r_stitch_drops_the_uncertain_small_token_and_large_returns_when_confident():
    policy = create_policy("r_stitch", MODELS, "small", {"threshold": 0.3})
    confident, uncertain = view(tokens=[1, 2, 3], rid="a"), view(tokens=[4, 5, 6], rid="b")
    both = [confident, uncertain]
    assert route(policy, both, step(both, [peaked(8), flat(9)])) == ["small", "large"]
    message = roundtrip(send(policy, uncertain, "large"))
    assert message.tokens == [4, 5, 6]  # the SLM's uncertain token 9 is dropped: the LLM regenerates it
    on_large = view("large", tokens=[4, 5, 6], state=message.state)
    assert route(policy, [on_large], step([on_large], [flat(2)])) == ["large"]  # still uncertain: stays
    on_large.token_ids.append(2)
    assert route(policy, [on_large], step([on_large], [peaked(11)])) == ["small"]
    back = roundtrip(send(policy, on_large, "small"))
    assert back.tokens[-2:] == [2, 11] and back.origins[-1] == 1  # the LLM's confident token is kept


def test_r_stitch_decision_does_not_depend_on_the_batch():
    policy = create_policy("r_stitch", MODELS, "small", {"threshold": 0.5})
    logits = [flat(1), peaked(2, 3.0), peaked(3, 1.5), torch.randn(32, generator=torch.Generator().manual_seed(1))]
    batch = [view(rid=str(i)) for i in range(4)]
    together = route(policy, batch, step(batch, logits))
    assert together == [route(policy, [r], step([r], [row_logits]))[0] for r, row_logits in zip(batch, logits)]


def test_glimp_defers_a_whole_step_on_an_uncertain_first_token():
    policy = create_policy("glimp", MODELS, "small", {"threshold": 0.3, "step_end_ids": [NEWLINE]})
    # Mid-step: never deferred, however uncertain.
    mid = view(tokens=[1, 2, 3, 4], prompt_len=3)
    assert route(policy, [mid], step([mid], [flat(5)])) == ["small"]
    # First token of a step (after a newline), confident: stays.
    start = view(tokens=[1, 2, 3, 4, NEWLINE], prompt_len=3)
    assert route(policy, [start], step([start], [peaked(5)])) == ["small"]
    # Uncertain first token: the step goes to the LLM, the glimpse token is dropped.
    assert route(policy, [start], step([start], [flat(5)])) == ["large"]
    message = roundtrip(send(policy, start, "large"))
    assert message.tokens == [1, 2, 3, 4, NEWLINE]
    # The LLM writes until it ends the step, then hands back with its newline kept.
    on_large = view("large", tokens=[1, 2, 3, 4, NEWLINE], prompt_len=3, state=message.state)
    for token in (12, 13):
        assert route(policy, [on_large], step([on_large], [peaked(token)])) == ["large"]
        on_large.token_ids.append(token)
    assert route(policy, [on_large], step([on_large], [peaked(NEWLINE)])) == ["small"]
    assert roundtrip(send(policy, on_large, "small")).tokens[-1] == NEWLINE


def test_glimp_first_generated_token_is_a_step_start_and_steps_are_capped():
    policy = create_policy("glimp", MODELS, "small", {"threshold": 0.3, "step_end_ids": [NEWLINE],
                                                       "max_step_tokens": 2})
    first = view(tokens=[1, 2, 3], prompt_len=3)
    assert route(policy, [first], step([first], [flat(4)])) == ["large"]
    on_large = view("large", tokens=[1, 2, 3], state=roundtrip(send(policy, first, "large")).state)
    assert route(policy, [on_large], step([on_large], [peaked(4)])) == ["large"]
    assert route(policy, [on_large], step([on_large], [peaked(5)])) == ["small"]  # cap of 2 tokens


def test_glimp_min_confidence_and_token_level_mode():
    # No step ends configured: every token is a step; the LLM returns after one token.
    policy = create_policy("glimp", MODELS, "small", {"threshold": 1.0, "min_confidence": 0.9})
    sure, unsure = view(rid="a"), view(rid="b")
    assert route(policy, [sure, unsure], step([sure, unsure], [peaked(4), peaked(4, 2.0)])) == ["small", "large"]
    on_large = view("large", state={"large_tokens": 0})
    assert route(policy, [on_large], step([on_large], [flat(3)])) == ["small"]


@pytest.mark.parametrize("params", [{"step_end_ids": "\n"}, {"max_step_tokens": 0}, {"threshold": "high"}])
def test_glimp_rejects_bad_params(params):
    with pytest.raises(PolicyError):
        create_policy("glimp", MODELS, "small", params)
