"""The tiny pair's routing configuration and the clients the served-pipeline tests read it with."""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

from tokenrouter.client import DEFAULT_MODEL, grpc_stream, inputs

PROMPTS = ["def add(a, b):", "import os\nfor name in", "class Stack:\n    def push(self, item):",
           "# sort a list of numbers\n", "while True:", "x = [i * i for i in range(10)]\nprint("]
MAX_MODEL_LEN = 512


def routing_config(pair: dict[str, Path], policy: str = "random", params: dict | None = None,
                   fronts: tuple[str, ...] = ("tokenrouter",)) -> dict:
    """The tiny pair, routing 30 % of positions to llm. One front unless ``fronts`` says more: each
    is a stub with its own tokenizer (~400 MB), and this machine is shared."""
    return {
        "models": {
            "slm": {"path": str(pair["small"]), "kv_cache_tokens": 4096, "block_size": 8, "max_batch_size": 16},
            "llm": {"path": str(pair["large"]), "kv_cache_tokens": 4096, "block_size": 8, "max_batch_size": 16,
                    "batch_threshold": [1, 2]},
        },
        "policy": {"name": policy, "params": params if params is not None else {"rate": 0.3, "seed": 11}},
        "scheduling": {"strategy": "tokenrouter", "max_wait_ms": 5, "max_active": 64},
        "max_model_len": MAX_MODEL_LEN,
        "frontend": {"names": list(fronts), "max_batch_size": 8},
    }


def metrics_text(server) -> str:
    """The metrics port's page."""
    host = server.http_url.rsplit(":", 1)[0]
    return urllib.request.urlopen(f"http://{host}:{server.ports.metrics}/metrics", timeout=10).read().decode()


def metrics(server) -> dict[str, float]:
    """tokenrouter_* samples from the metrics port, keyed by 'name{labels}'."""
    samples = {}
    for line in metrics_text(server).splitlines():
        match = re.match(r"^(tokenrouter_\w+)(\{[^}]*\})? ([0-9.eE+-]+)$", line)
        if match:
            samples[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return samples


def wait_for_idle_pools(server, timeout_s: float = 30.0) -> dict[str, float]:
    """Poll until no model holds a request or a KV block (metrics refresh twice a second)."""
    deadline = time.monotonic() + timeout_s
    while True:
        samples = metrics(server)
        busy = {k: v for k, v in samples.items()
                if k.startswith(("tokenrouter_kv_blocks_used", "tokenrouter_pending_requests",
                                 "tokenrouter_running_requests", "tokenrouter_active_requests")) and v != 0}
        if not busy or time.monotonic() > deadline:
            return busy
        time.sleep(0.25)


def stream_ids(server, prompt: str, model: str = DEFAULT_MODEL, **params) -> tuple[list[int], list[str], str]:
    replies = grpc_stream(server.grpc_url, inputs(text_input=prompt, stream=True, **params), model)
    return [i for r in replies for i in r.ids], [m for r in replies for m in r.models], replies[-1].finish_reason
