"""Every shipped policy served through Triton by editing only `routing_policy/config.pbtxt` (and,
for the learned routers, putting their weights in `routing_policy/1/`), then restarting the server.

Oracle: the served tokens and per-token models equal the embedded TokenRouter's on the
configuration the edited repository describes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from google.protobuf import text_format
from transformers import AutoConfig

from tokenrouter import TokenRouter
from tokenrouter.engine.factory import create_engine
from tokenrouter.policies import registered_policies
from tokenrouter.policies.networks import build_network, save_router
from tokenrouter.serving.repository import HEADER, ROUTING_POLICY, read_model_config, read_repository, render_repository

from tokenrouter.client import http_post
from helpers.routing import PROMPTS, routing_config, stream_ids

NEWLINE = 198  # "\n" in the tiny pair's byte-level BPE: a GlimpRouter step is a line
# Parameters under which each policy routes on the tiny pair's (very confident) distributions; the
# learned routers get seeded random networks (the served path must reproduce them, not be good).
SETTINGS: dict[str, dict] = {
    "slm_only": {},
    "llm_only": {},
    "random": {"rate": 0.3, "seed": 4},
    "r_stitch": {"threshold": 0.2},
    "glimp": {"threshold": 0.05, "step_end_ids": [NEWLINE], "max_step_tokens": 4},
    "citer": {},
    "r2r": {},
    "co_llm": {},
    "ensemble": {"weights": [0.3, 0.7]},
    "query_level": {"mode": "length", "min_prompt_tokens": 8},  # PROMPTS[2] is the long one
}
LEARNED = {"citer", "r2r", "co_llm"}
# Which models write tokens: both, except for the single-model policies and ME (which commits the
# mixed token on the last model of its ring, here the large one).
WRITERS = {"slm_only": {"slm"}, "llm_only": {"llm"}, "ensemble": {"llm"}}


def test_every_shipped_policy_is_listed_here() -> None:
    # other tests register policies of their own; the shipped ones live in the package
    shipped = {name for name, cls in registered_policies().items() if cls.__module__.startswith("tokenrouter.")}
    assert set(SETTINGS) == shipped


@pytest.fixture(scope="module")
def repository(tiny_pair, tmp_path_factory) -> Path:
    """One rendered repository; each test edits its routing_policy model. Its models ask for
    ``batch_threshold: auto`` (fixed B is served on the suite's routing server): a repository that said
    so once rendered fine and failed at load ("... is 'auto' but no online estimator was given"); each
    subserver process now runs its own estimator and trades observations with its peers
    (tests/runtime/test_auto_per_process.py shows they solve), and the served output must still equal
    the embedded engine's."""
    config = routing_config(tiny_pair)
    for spec in config["models"].values():
        spec["batch_threshold"] = "auto"
    return render_repository(config, tmp_path_factory.mktemp("policies-repo") / "repo")


@pytest.fixture(scope="module")
def engines(repository):
    """The tiny engines once, shared by every embedded reference."""
    config = read_repository(repository)
    built = {name: create_engine(name, spec) for name, spec in config.models.items()}
    yield built
    for engine in built.values():
        engine.close()


def write_router(directory: Path, algorithm: str, small_model: Path) -> str:
    """A seeded random router for the tiny SLM, as train-router lays one out; returns its folder name."""
    shape = AutoConfig.from_pretrained(small_model)
    if algorithm == "r2r":
        architecture = {"kind": "r2r", "hidden_size": shape.hidden_size, "vocab_size": shape.vocab_size, "top_k": 8,
                        "d_model": 16, "depth": 1, "expansion": 2}
    else:
        architecture = {"kind": "hidden_head", "hidden_size": shape.hidden_size, "width": 16, "depth": 1}
    torch.manual_seed(7)
    save_router(directory / algorithm, build_network(architecture),
                {"algorithm": algorithm, "architecture": architecture, "threshold": 0.5})
    return algorithm


def edit_routing_policy(repository: Path, policy: str, params: dict, weights: str) -> None:
    """Set policy, policy_params and policy_weights in routing_policy/config.pbtxt and nothing else."""
    config = read_model_config(repository / ROUTING_POLICY)
    config.parameters["policy"].string_value = policy
    config.parameters["policy_params"].string_value = json.dumps(params)
    config.parameters["policy_weights"].string_value = weights
    (repository / ROUTING_POLICY / "config.pbtxt").write_text(HEADER + text_format.MessageToString(config))


# Each case starts a server (20-60 s here). The default suite serves what only a served policy does: a
# deferral (the uncertain token dropped, the large model regenerating it) whose learned weights sit in
# routing_policy/1/ and that reads hidden states (co_llm), and a policy that reads every model's logits and
# mixes them across the subservers (ensemble). The plain seeded router (random) is served by
# test_routing_server.py's oracles on the suite's routing server; r_stitch is a deferral on the logits,
# both of which those two serve, and its rule is a unit test's (tests/policies/test_policy_entropy.py);
# the runtime oracles hold every policy's tokens, and `-m slow` serves the rest too.
SERVED_BY_DEFAULT = {"co_llm", "ensemble"}


@pytest.mark.parametrize("policy", [p if p in SERVED_BY_DEFAULT else pytest.param(p, marks=pytest.mark.slow)
                                    for p in SETTINGS])
def test_policy_served_by_editing_the_routing_policy_model(policy, repository, engines, start_server, tiny_pair):
    weights = write_router(repository / ROUTING_POLICY / "1", policy, tiny_pair["small"]) if policy in LEARNED else ""
    edit_routing_policy(repository, policy, SETTINGS[policy], weights)
    config = read_repository(repository)
    assert (config.policy.name, config.policy.params) == (policy, SETTINGS[policy])
    assert {spec.batch_threshold for spec in config.models.values()} == {"auto"}

    server = start_server(repository)
    try:
        status, text = http_post(server.http_url, "/v2/models/routing_policy/infer", {"inputs": []})
        assert status == 200, text
        assert json.loads(json.loads(text)["outputs"][0]["data"][0])["policy"] == policy
        with TokenRouter(config, engines=engines) as embedded:
            expected = embedded.generate(PROMPTS[:3], max_tokens=16, seed=9)
        served = [stream_ids(server, prompt, max_tokens=16, random_seed=9) for prompt in PROMPTS[:3]]
    finally:
        server.stop()
    for (ids, models, reason), want in zip(served, expected):
        assert (ids, models, reason) == (want.token_ids, want.models, want.finish_reason)
    used = {model for _, models, _ in served for model in models}
    assert used == WRITERS.get(policy, {"slm", "llm"})
