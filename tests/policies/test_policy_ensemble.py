"""ME: the request visits every model once per token; the last one samples the weighted mixture."""

from __future__ import annotations

import json

import pytest
import torch

from policy_builders import peaked, roundtrip, step, view, route, send
from tokenrouter.engine.base import SamplingParams
from tokenrouter.engine.sampling import sample_tokens
from tokenrouter.policies import PolicyError, create_policy

THREE = ["a", "b", "c"]


def one_token(policy, models, logits_by_model, *, tokens=(1, 2, 3), seed=0, temperature=0.0):
    """Drive one token around the ring; returns (token the last model committed, messages sent)."""
    request = view(models[0], tokens=tokens, seed=seed, temperature=temperature, models=models)
    messages = []
    for hop, model in enumerate(models):
        out = step([request], [logits_by_model[model]])
        destination = route(policy, [request], out)[0]  # the last hop replaces the sampled token
        assert destination == models[(hop + 1) % len(models)]
        message = roundtrip(send(policy, request, destination))
        messages.append(message)
        if hop < len(models) - 1:
            request = view(destination, tokens=tokens, seed=seed, temperature=temperature, models=models,
                           state=message.state)
    return request.sampled_token, messages


@pytest.mark.parametrize("weights, expected", [
    (None, 1),                              # default 0.5/0.3/0.2: the first model's favourite wins
    ([0.2, 0.3, 0.5], 3),
    ({"a": 0.3, "b": 0.4, "c": 0.3}, 2),
])
def test_three_model_ring_mixes_with_the_configured_weights(weights, expected):
    policy = create_policy("ensemble", THREE, "a", {} if weights is None else {"weights": weights})
    token, messages = one_token(policy, THREE, {"a": peaked(1), "b": peaked(2), "c": peaked(3)})
    assert token == expected
    forward_a, forward_b, back = messages
    # Forward hops carry no token (nothing committed before the mixture is sampled) and the mixture so far.
    assert forward_a.tokens == [1, 2, 3] and forward_b.tokens == [1, 2, 3]
    w = policy.weights_by_model
    mix_a = dict(zip(forward_a.state["mix"]["ids"], forward_a.state["mix"]["p"]))
    assert mix_a[1] == pytest.approx(w["a"], rel=1e-6)
    mix_b = dict(zip(forward_b.state["mix"]["ids"], forward_b.state["mix"]["p"]))
    assert mix_b[1] == pytest.approx(w["a"], rel=1e-6) and mix_b[2] == pytest.approx(w["b"], rel=1e-6)
    # The last model commits the mixture's token, attributed to itself, and clears the state.
    assert back.tokens == [1, 2, 3, expected] and back.origins[-1] == 2 and back.state == {}


def test_sampling_follows_the_mixture_distribution():
    models = ["small", "large"]
    policy = create_policy("ensemble", models, "small", {"weights": [0.7, 0.3]})
    vocab = 8
    small, large = torch.full((vocab,), -4.0), torch.full((vocab,), -4.0)
    small[0], small[1] = 3.0, 2.0
    large[5] = 5.0
    mixture = 0.7 * torch.softmax(small.double(), -1) + 0.3 * torch.softmax(large.double(), -1)
    draws = 3000
    counts = torch.zeros(vocab)
    for position in range(draws):
        tokens = list(range(3 + position % 5))
        token, _ = one_token(policy, models, {"small": small, "large": large}, tokens=tokens, seed=position,
                             temperature=1.0)
        counts[token] += 1
        if position < 20:  # exactly the reproducible sampler on log(mixture) at that (seed, position)
            params = SamplingParams(temperature=1.0, seed=position)
            assert token == int(sample_tokens(mixture.log()[None], [params], [len(tokens)])[0])
    assert torch.allclose(counts / draws, mixture.float(), atol=0.03)
    assert counts[5] / draws > 0.2  # the large model's favourite shows up only through the mixture


def test_carried_state_is_sparse_and_small():
    models = ["small", "large"]
    policy = create_policy("ensemble", models, "small", {"carry_top_k": 16})
    logits = torch.randn(151_936, generator=torch.Generator().manual_seed(0)) * 3
    request = view("small", models=models)
    route(policy, [request], step([request], [logits]))
    state = roundtrip(send(policy, request, "large")).state
    assert len(state["mix"]["ids"]) == 16
    assert len(json.dumps(state)) < 1000
    top = torch.topk(0.625 * torch.softmax(logits.double(), -1), 16)  # default weights 0.5/0.3 normalized
    assert sorted(top.indices.tolist()) == state["mix"]["ids"]


def test_batch_rows_are_independent():
    models = ["small", "large"]
    policy = create_policy("ensemble", models, "small", {"weights": [0.5, 0.5]})
    generator = torch.Generator().manual_seed(3)
    rows = [torch.randn(32, generator=generator) for _ in range(4)]
    carried = [{"mix": {"ids": [i], "p": [0.5]}} for i in range(4)]
    batch = [view("large", rid=str(i), models=models, state=carried[i], seed=i, temperature=1.0) for i in range(4)]
    together = step(batch, rows)
    route(policy, batch, together)
    alone = []
    for i in range(4):
        single = [view("large", rid=str(i), models=models, state=carried[i], seed=i, temperature=1.0)]
        out = step(single, [rows[i]])
        route(policy, single, out)
        alone.append(single[0].sampled_token)
    assert [request.sampled_token for request in batch] == alone


@pytest.mark.parametrize("params", [{"weights": [1.0]}, {"weights": [0.5, -0.5]}, {"weights": {"small": 1.0}},
                                    {"weights": ["x", 1]}, {"carry_top_k": 0}])
def test_rejects_bad_params(params):
    with pytest.raises(PolicyError):
        create_policy("ensemble", ["small", "large"], "small", params)


def test_a_hop_without_the_mixture_is_an_error():
    policy = create_policy("ensemble", ["small", "large"], "small")
    request = view("large")
    with pytest.raises(PolicyError, match="without a mixture"):
        route(policy, [request], step([request], [peaked(1)]))
