"""Router networks: shapes, sizes, save/load round trip."""

from __future__ import annotations

import json

import pytest
import torch

from tokenrouter.policies import PolicyError
from tokenrouter.policies.networks import (HiddenStateHead, R2RRouter, build_network, count_parameters, load_router,
                                           mlp, save_router)


def test_mlp_depth_and_shapes():
    assert len(mlp(8, 4, 0, 1)) == 1  # depth 0 is a linear layer
    net = mlp(8, 4, 2, 3)
    assert [m.out_features for m in net if isinstance(m, torch.nn.Linear)] == [4, 4, 3]
    assert net(torch.zeros(5, 8)).shape == (5, 3)


def test_r2r_router_shapes_and_default_size_for_the_real_pair():
    router = R2RRouter(hidden_size=896, vocab_size=1000, top_k=100)
    out = router(torch.randn(3, 896), torch.tensor([0, 5, 999]), torch.randn(3, 100).sort(descending=True).values)
    assert out.shape == (3,)
    # Sized for CPU training: about 2M trainable parameters, the frozen embedding table not among them.
    assert 1_000_000 < count_parameters(router) < 3_000_000
    assert router.token_embedding.dtype == torch.float16 and not router.token_embedding.requires_grad


def test_r2r_ignores_a_common_shift_of_the_top_logits():
    router = R2RRouter(hidden_size=8, vocab_size=10, top_k=4, d_model=8, depth=1)
    hidden, tokens = torch.randn(2, 8), torch.tensor([1, 2])
    top = torch.randn(2, 4).sort(descending=True).values
    assert torch.allclose(router(hidden, tokens, top), router(hidden, tokens, top + 7.0), atol=1e-5)


def test_hidden_head_shapes():
    assert HiddenStateHead(896, width=32, depth=2)(torch.randn(4, 896)).shape == (4,)


def test_build_network_errors():
    with pytest.raises(PolicyError, match="unknown router architecture"):
        build_network({"kind": "transformer"})
    with pytest.raises(PolicyError, match="hidden_head"):
        build_network({"kind": "hidden_head", "hidden_size": 8, "colour": "red"})


def test_save_load_round_trip(tmp_path):
    arch = {"kind": "r2r", "hidden_size": 8, "vocab_size": 20, "top_k": 4, "d_model": 16, "depth": 2, "expansion": 2}
    torch.manual_seed(0)
    network = build_network(arch)
    with torch.no_grad():
        network.token_embedding.copy_(torch.randn(20, 8).half())
    save_router(tmp_path, network, {"algorithm": "r2r", "architecture": arch, "threshold": 0.25,
                                    "training": {"seed": 1}})
    loaded = load_router(tmp_path / "metadata.json", "r2r")  # the metadata file's path works too
    assert loaded.threshold == 0.25 and loaded.metadata["training"] == {"seed": 1}
    assert json.loads((tmp_path / "metadata.json").read_text())["format"] == "tokenrouter-router/1"
    inputs = (torch.randn(3, 8), torch.tensor([0, 4, 19]), torch.randn(3, 4))
    assert torch.equal(loaded.network(*inputs), network(*inputs))
    assert not any(p.requires_grad for p in loaded.network.parameters())


def test_save_needs_the_essential_metadata(tmp_path):
    with pytest.raises(ValueError, match="threshold"):
        save_router(tmp_path, HiddenStateHead(8), {"algorithm": "citer", "architecture": {"kind": "hidden_head"}})
