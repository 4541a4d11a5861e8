"""TensorRT-LLM's ``nv_trt_llm_*`` metric families, so a dashboard built for TensorRT-LLM reads ours.

The families, their label names and label values are the ones tensorrtllm_backend's custom metrics
reporter exports, with its ``model="tensorrt_llm"`` and ``version="1"`` (a dashboard's query for
them finds ours); ``tokenrouter_model`` says which of our models (``slm``, ``llm``) a series is,
one set per subserver: sum over it for the whole router.
Values are snapshots of the subserver taken on the metrics thread (gauges, like TensorRT-LLM's).
Label values we cannot fill honestly (GPU memory, KV block reuse, micro-batches of pipeline
parallelism) are left out rather than reported as zero.
"""

from __future__ import annotations

import time
from typing import Any

from ...runtime.subserver import Subserver

TRT_LLM_LABELS = {"model": "tensorrt_llm", "version": "1"}  # as tensorrtllm_backend labels its series
# family name -> (description, label name, label values)
FAMILIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "nv_trt_llm_request_metrics": ("TRT LLM request metrics", "request_type",
                                   ("active", "max", "scheduled", "context", "waiting")),
    "nv_trt_llm_kv_cache_block_metrics": ("TRT LLM KV cache block metrics", "kv_cache_block_type",
                                          ("max", "free", "used", "tokens_per", "fraction")),
    "nv_trt_llm_inflight_batcher_metrics": ("TRT LLM inflight_batcher-specific metrics",
                                            "inflight_batcher_specific_metric",
                                            ("total_context_tokens", "generation_requests", "paused_requests")),
    "nv_trt_llm_general_metrics": ("General TRT LLM metrics", "general_type", ("iteration_counter", "timestamp")),
}


def trt_llm_snapshot(server: Subserver) -> dict[str, dict[str, float]]:
    """The values of every family for one subserver, read without stopping its loop.

    ``active``: requests whose KV this model holds (running here or pending while a peer decodes);
    ``scheduled``: those it runs; ``context``: scheduled ones with more than one token left to
    compute (prefill, or an extend after a peer's tokens); ``paused_requests``: the pending ones;
    ``waiting``: requests queued for admission (entry model only).
    """
    core, engine = server.core, server.engine
    held = list(core.requests.values())  # one C-level copy: safe against the loop thread's changes
    runnable = set(core.runnable)
    scheduled = [r for r in held if r.rid in runnable]
    left = [len(r.token_ids) - r.cached for r in scheduled]
    context_left = [n for n in left if n > 1]
    total, free = engine.num_total_blocks, engine.num_free_blocks
    waiting = core.queued  # the admission queue lives at the entry: 0 elsewhere
    return {
        "nv_trt_llm_request_metrics": {"active": len(held), "max": core.limits.max_active,
                                       "scheduled": len(scheduled), "context": len(context_left),
                                       "waiting": waiting},
        "nv_trt_llm_kv_cache_block_metrics": {"max": total, "free": free, "used": total - free,
                                              "tokens_per": engine.block_size,
                                              "fraction": (total - free) / total if total else 0.0},
        "nv_trt_llm_inflight_batcher_metrics": {"total_context_tokens": sum(context_left),
                                                "generation_requests": len(scheduled) - len(context_left),
                                                "paused_requests": len(held) - len(scheduled)},
        "nv_trt_llm_general_metrics": {"iteration_counter": core.stats.steps, "timestamp": int(time.time())},
    }


class TrtLlmMetrics:
    """Gauges for one subserver, refreshed by ``update`` (called from ``SubserverMetrics``' thread)."""

    def __init__(self, pb_utils: Any, server: Subserver) -> None:
        family_type = pb_utils.MetricFamily
        self._server = server
        self._families: list[Any] = []  # Triton requires a family to outlive its metrics
        self._gauges: dict[tuple[str, str], Any] = {}
        for name, (description, label, values) in FAMILIES.items():
            family = family_type(name=name, description=description, kind=family_type.GAUGE)
            self._families.append(family)
            for value in values:
                self._gauges[name, value] = family.Metric(
                    labels={**TRT_LLM_LABELS, "tokenrouter_model": server.name, label: value})

    def update(self) -> None:
        for name, values in trt_llm_snapshot(self._server).items():
            for value, number in values.items():
                self._gauges[name, value].set(float(number))
