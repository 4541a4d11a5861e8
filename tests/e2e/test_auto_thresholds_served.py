"""``batch_threshold: auto`` served by Triton: the reported bug was a repository that rendered fine
and failed at load ("... is 'auto' but no online estimator was given"). Each subserver process now
runs its own estimator and trades observations with its peers (tests/runtime/test_auto_per_process.py
shows they solve); here the served output must equal the embedded engine's, as for fixed B."""

from __future__ import annotations

import concurrent.futures

from tokenrouter import TokenRouter
from tokenrouter.serving.repository import render_repository

from helpers.routing import PROMPTS, routing_config, stream_ids


def test_auto_thresholds_load_and_serve_the_embedded_output(start_server, tiny_pair, tmp_path):
    config = routing_config(tiny_pair)
    for spec in config["models"].values():
        spec["batch_threshold"] = "auto"
    server = start_server(render_repository(config, tmp_path / "repo"))
    try:
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            served = list(pool.map(lambda p: stream_ids(server, p, max_tokens=16, random_seed=4), PROMPTS))
    finally:
        server.stop()
    with TokenRouter.from_config(config) as embedded:
        expected = embedded.generate(PROMPTS, max_tokens=16, seed=4)
    for (ids, models, reason), want in zip(served, expected):
        assert (ids, models, reason) == (want.token_ids, want.models, want.finish_reason)
    assert any("llm" in models for _, models, _ in served)
