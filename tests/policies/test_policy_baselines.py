"""SLM-only, LLM-only and the seeded random router on constructed logits."""

from __future__ import annotations

import pytest

from policy_builders import MODELS, peaked, roundtrip, step, view, route, send
from tokenrouter.policies import PolicyError, create_policy


def test_slm_only_stays_and_commits_everything():
    policy = create_policy("slm_only", MODELS, "small")
    batch = [view("small"), view("small", rid="r1")]
    assert route(policy, batch, step(batch, [peaked(3), peaked(4)])) == ["small", "small"]


def test_llm_only_hands_over_at_once_and_drops_the_small_token():
    policy = create_policy("llm_only", MODELS, "small")
    request = view("small", tokens=[5, 6, 7])
    assert route(policy, [request], step([request], [peaked(9)])) == ["large"]
    message = roundtrip(send(policy, request, "large"))
    assert message.tokens == [5, 6, 7] and 9 not in message.tokens  # the prompt only: nothing from the SLM
    on_large = view("large", tokens=[5, 6, 7])
    assert route(policy, [on_large], step([on_large], [peaked(2)])) == ["large"]


def decisions(policy, requests):
    return route(policy, requests, step(requests, [peaked(1)] * len(requests)))


def test_random_rate_seed_and_batch_independence():
    policy = create_policy("random", MODELS, "small", {"rate": 0.3, "seed": 7})
    # One request at 400 successive positions: the deferral rate is the configured one.
    alone = [decisions(policy, [view(tokens=list(range(n)), prompt_len=1)])[0] for n in range(1, 401)]
    assert 0.22 < alone.count("large") / 400 < 0.38
    # The same positions decided inside one big batch, reversed: identical per request.
    batch = [view(tokens=list(range(n)), prompt_len=1, rid=f"r{n}") for n in range(400, 0, -1)]
    assert decisions(policy, batch)[::-1] == alone
    # Another policy seed gives other decisions; the same seed gives the same ones.
    other = create_policy("random", MODELS, "small", {"rate": 0.3, "seed": 8})
    again = create_policy("random", MODELS, "small", {"rate": 0.3, "seed": 7})
    requests = [view(tokens=list(range(n)), prompt_len=1) for n in range(1, 401)]
    assert [decisions(other, [r])[0] for r in requests] != alone
    assert [decisions(again, [r])[0] for r in requests] == alone


def test_random_large_returns_after_run_length_and_messages():
    policy = create_policy("random", MODELS, "small", {"rate": 1.0, "run_length": 2})
    request = view("small", tokens=[1, 2, 3])
    assert decisions(policy, [request]) == ["large"]
    to_large = roundtrip(send(policy, request, "large"))
    assert to_large.tokens == [1, 2, 3] and to_large.state == {"large_tokens": 0}  # drafted token dropped
    on_large = view("large", tokens=[1, 2, 3], state=to_large.state)
    assert decisions(policy, [on_large]) == ["large"]
    on_large.token_ids.append(1)
    assert decisions(policy, [on_large]) == ["small"]
    back = roundtrip(send(policy, on_large, "small"))
    assert back.tokens[-1] == 1 and back.origins[-1] == 1 and back.state == {}


def test_random_keep_sampled_sends_the_drafted_token():
    policy = create_policy("random", MODELS, "small", {"rate": 1.0, "keep_sampled": True})
    request = view("small", tokens=[1, 2, 3])
    decisions(policy, [request])
    assert roundtrip(send(policy, request, "large")).tokens == [1, 2, 3, 1]


@pytest.mark.parametrize("params", [{"rate": 1.5}, {"run_length": 0}, {"rate": "often"}])
def test_random_rejects_bad_params(params):
    with pytest.raises(PolicyError):
        create_policy("random", MODELS, "small", params)
