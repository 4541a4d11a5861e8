"""Read Triton's metrics port: samples from the Prometheus text format, histogram differences."""

from __future__ import annotations

import re
import urllib.request
from typing import Any

_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{([^}]*)\})?\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

Samples = dict[tuple[str, frozenset], float]


def parse(text: str) -> Samples:
    """(metric name, frozenset of (label, value)) -> value, for every sample line."""
    samples: Samples = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and not line.startswith("#"):
            labels = frozenset(_LABEL.findall(match.group(2) or ""))
            samples[(match.group(1), labels)] = float(match.group(3))
    return samples


def scrape(url: str, timeout_s: float = 10.0) -> Samples:
    with urllib.request.urlopen(f"http://{url}/metrics", timeout=timeout_s) as reply:
        return parse(reply.read().decode())


def histogram_delta(before: Samples, after: Samples, name: str) -> dict[str, dict[str, Any]]:
    """Per ``model`` label: observations, mean and bucket-bound quantiles between two scrapes."""
    def delta(key: tuple[str, frozenset]) -> float:
        return after[key] - before.get(key, 0.0)

    out: dict[str, dict[str, Any]] = {}
    for (metric, labels), _ in sorted(after.items(), key=lambda item: sorted(item[0][1])):
        model = dict(labels).get("model")
        if metric != f"{name}_count" or not model:
            continue
        count = delta((metric, labels))
        if count <= 0:
            continue
        buckets = sorted((float(dict(key[1])["le"]), delta(key)) for key in after
                         if key[0] == f"{name}_bucket" and dict(key[1]).get("model") == model)
        out[model] = {"count": int(count), "mean_s": delta((f"{name}_sum", labels)) / count,
                      "p50_le_s": _bucket_quantile(buckets, count, 0.5),
                      "p90_le_s": _bucket_quantile(buckets, count, 0.9)}
    return out


def _bucket_quantile(cumulative: list[tuple[float, float]], count: float, q: float) -> float | None:
    """The upper bound of the first bucket holding the q-quantile (inf: above every finite bound)."""
    for bound, seen in cumulative:
        if seen >= q * count:
            return bound
    return None


def counter_delta(before: Samples, after: Samples, name: str, **only: str) -> dict[str, float]:
    """Per ``model`` label: how much counter ``name`` grew between two scrapes (summed over other labels,
    among the samples whose labels include ``only``)."""
    out: dict[str, float] = {}
    for (metric, labels), value in after.items():
        model = dict(labels).get("model")
        if metric == name and model and set(only.items()) <= labels:
            out[model] = out.get(model, 0.0) + value - before.get((metric, labels), 0.0)
    return out


def triton_queue_delta(before: Samples, after: Samples) -> dict[str, dict[str, float]]:
    """Per model, from Triton's own counters: requests that succeeded and their mean wait in the
    model's queue (ms) between two scrapes; where a serving hop's requests pile up."""
    requests = counter_delta(before, after, "nv_inference_request_success")
    queued_us = counter_delta(before, after, "nv_inference_queue_duration_us")
    return {model: {"requests": int(count), "queue_ms": queued_us.get(model, 0.0) / count / 1e3}
            for model, count in sorted(requests.items()) if count > 0}
