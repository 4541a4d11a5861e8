"""CITER, Co-LLM and R2R on constructed hidden states, with router files written to a temp dir."""

from __future__ import annotations

import pytest
import torch

from policy_builders import MODELS, hidden_rows, peaked, roundtrip, step, view, write_head, route, send
from tokenrouter.policies import PolicyError, create_policy
from tokenrouter.policies.networks import build_network, save_router

R2R_ARCH = {"kind": "r2r", "hidden_size": 8, "vocab_size": 32, "top_k": 5, "d_model": 16, "depth": 1, "expansion": 2}


@pytest.mark.parametrize("name", ["citer", "co_llm"])
def test_hidden_state_heads_defer_and_the_large_model_returns_after_one_token(name, tmp_path):
    policy = create_policy(name, MODELS, "small", weights=write_head(tmp_path, name))
    assert policy.needs_hidden and policy.threshold == 0.5  # from the router's metadata
    keep, defer = view(tokens=[1, 2, 3], rid="a"), view(tokens=[4, 5, 6], rid="b")
    out = step([keep, defer], [peaked(7), peaked(8)], hidden_rows(-1.0, +1.0))
    assert route(policy, [keep, defer], out) == ["small", "large"]
    message = roundtrip(send(policy, defer, "large"))
    assert message.tokens == [4, 5, 6] and message.state == {"large_tokens": 0}  # the SLM token 8 is dropped
    on_large = view("large", tokens=[4, 5, 6], state=message.state)
    assert route(policy, [on_large], step([on_large], [peaked(9)])) == ["small"]  # no hidden needed on the LLM
    back = roundtrip(send(policy, on_large, "small"))
    assert back.tokens[-1] == 9 and back.origins[-1] == 1


def test_threshold_param_overrides_the_trained_one(tmp_path):
    weights = write_head(tmp_path, "citer", gain=0.1)  # scores near 0.5: sigmoid(±0.26)
    hidden = hidden_rows(+1.0)
    low = create_policy("citer", MODELS, "small", {"threshold": 0.5}, weights=weights)
    high = create_policy("citer", MODELS, "small", {"threshold": 0.6}, weights=weights)
    request = view()
    assert route(low, [request], step([request], [peaked(1)], hidden)) == ["large"]
    assert route(high, [request], step([request], [peaked(1)], hidden)) == ["small"]


def write_r2r(directory, seed=0):
    torch.manual_seed(seed)
    network = build_network(R2R_ARCH)
    with torch.no_grad():
        network.token_embedding.copy_(torch.randn(32, 8).half())
    save_router(directory, network, {"algorithm": "r2r", "architecture": R2R_ARCH, "threshold": 0.5})
    return network


def test_r2r_scores_hidden_sampled_token_and_top_logits(tmp_path):
    network = write_r2r(tmp_path)
    policy = create_policy("r2r", MODELS, "small", weights=tmp_path)
    assert policy.needs_hidden and policy.top_logits == 5
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 32, generator=generator) * 3
    hidden = torch.randn(4, 8, generator=generator)
    batch = [view(rid=str(i)) for i in range(4)]
    out = step(batch, list(logits), hidden)
    expected = torch.sigmoid(network(hidden, out.sampled, torch.topk(logits, 5).values))
    scores = [policy.score(out, i) for i in range(4)]
    assert scores == pytest.approx(expected.tolist(), abs=1e-6)
    # Decisions follow the threshold: put it between the rows' scores.
    middle = sorted(scores)[1] + 1e-7
    policy.threshold = middle
    assert route(policy, batch, out) == ["large" if s >= middle else "small" for s in scores]
    # The sampled token is an input: another token, another score.
    out.sampled[0] = (out.sampled[0] + 1) % 32
    assert policy.score(out, 0) != pytest.approx(scores[0], abs=1e-6)


def test_r2r_uses_engine_top_logits_when_given(tmp_path):
    write_r2r(tmp_path)
    policy = create_policy("r2r", MODELS, "small", weights=tmp_path)
    generator = torch.Generator().manual_seed(2)
    logits, hidden = torch.randn(2, 32, generator=generator), torch.randn(2, 8, generator=generator)
    batch = [view(rid="a"), view(rid="b")]
    out = step(batch, list(logits), hidden)
    computed = [policy.score(out, i) for i in range(2)]
    top = torch.topk(logits, 10)  # the engine may give more than k, in any order
    out.topk_values, out.topk_indices = top.values.flip(-1), top.indices.flip(-1)
    assert [policy.score(out, i) for i in range(2)] == pytest.approx(computed, abs=1e-7)


def test_decisions_do_not_depend_on_the_batch(tmp_path):
    write_r2r(tmp_path)
    policy = create_policy("r2r", MODELS, "small", weights=tmp_path)
    generator = torch.Generator().manual_seed(3)
    logits, hidden = torch.randn(6, 32, generator=generator) * 2, torch.randn(6, 8, generator=generator)
    batch = [view(rid=str(i)) for i in range(6)]
    together = [policy.score(step(batch, list(logits), hidden), i) for i in range(6)]
    alone = [policy.score(step([view()], [logits[i]], hidden[i:i + 1]), 0) for i in range(6)]
    assert together == alone  # bit-for-bit: each row is scored alone


def test_loading_errors(tmp_path):
    with pytest.raises(PolicyError, match="train-router --algo citer"):
        create_policy("citer", MODELS, "small")
    with pytest.raises(PolicyError, match="missing"):
        create_policy("citer", MODELS, "small", weights=tmp_path / "nowhere")
    write_head(tmp_path / "co", "co_llm")
    with pytest.raises(PolicyError, match="trained for 'co_llm', not 'citer'"):
        create_policy("citer", MODELS, "small", weights=tmp_path / "co")
    # The metadata promises a wider head than the safetensors file holds.
    write_head(tmp_path / "bad", "citer", hidden_size=8)
    meta = (tmp_path / "bad" / "metadata.json")
    meta.write_text(meta.read_text().replace('"hidden_size": 8', '"hidden_size": 16'))
    with pytest.raises(PolicyError, match="does not match its architecture"):
        create_policy("citer", MODELS, "small", weights=tmp_path / "bad")
    meta.write_text("{not json")
    with pytest.raises(PolicyError, match="not valid JSON"):
        create_policy("citer", MODELS, "small", weights=tmp_path / "bad")


def test_route_errors_on_missing_or_foreign_hidden_states(tmp_path):
    policy = create_policy("citer", MODELS, "small", weights=write_head(tmp_path, "citer"))
    request = view()
    with pytest.raises(PolicyError, match="needs hidden states"):
        route(policy, [request], step([request], [peaked(1)]))
    with pytest.raises(PolicyError, match="hidden size 8"):
        route(policy, [request], step([request], [peaked(1)], torch.zeros(1, 896)))
