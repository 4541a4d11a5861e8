"""Step costs of an engine as the throughput model takes them, measured at the batch sizes that occur.

Per model: the decode step at every batch size 1..N (timed at a few sizes, linear in between, as
``thresholds.step_latencies``), and what a row that feeds k tokens adds to a step of decode rows:
a step of b decode rows plus one row extending its sequence by k is timed against a step of b + 1
decode rows, for a few k, and ``arrival + per_token (k - 1)`` is fitted to the differences (least
squares, both clamped at >= 0). The k's reach the context a first visit prefills, so the fit covers
prefills and the short extends of a resume alike. The result is a file `tokenrouter throughput --file`
reads (``pair_file``).

On the simulated engine the step time is the profile's latency of that step (what the engine
sleeps; timing the sleep would only add the machine's noise), elsewhere the wall clock.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Sequence

import numpy as np

from tokenrouter.engine.base import Engine, StepRow
from tokenrouter.engine.simulated import SimulatedEngine


def timed_step(engine: Engine, rows: list[StepRow]) -> tuple[float, list[int]]:
    """(seconds, sampled tokens) of one engine step."""
    started = time.perf_counter()
    result = engine.step(rows)
    elapsed = time.perf_counter() - started
    if isinstance(engine, SimulatedEngine):
        elapsed = engine.last_latency_s
    return elapsed, result.sampled.tolist()


def measure_step_costs(engine: Engine, max_batch: int, *, context: int = 256, extends: Sequence[int] = (1, 8, 64),
                       samples: int = 3, vocab: int | None = None) -> dict[str, Any]:
    """Decode latency per batch size 1..max_batch and the fitted per-token and per-arrival costs (seconds).

    ``context``: the tokens every measured sequence holds first (the prompt a first visit prefills);
    ``extends``: the k's timed (two or more; the largest near ``context`` covers first-visit prefills)."""
    if max_batch < 1 or context < 2 or samples < 1 or len(set(extends)) < 2 or min(extends) < 1:
        raise ValueError("need max_batch >= 1, context >= 2, samples >= 1 and two or more extend sizes >= 1")
    high = (vocab or engine.vocab_size) - 2  # stay clear of the usual end-of-sequence ids at the top
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, high, size=context + max(extends) * (samples + 2)).tolist()
    ids = [f"step-costs-{i}" for i in range(max_batch + 1)]
    for seq_id in ids:
        engine.add_sequence(seq_id)
    try:
        _, last = timed_step(engine, [StepRow(seq_id, tokens[:context]) for seq_id in ids])
        feed = {seq_id: [t] for seq_id, t in zip(ids, last)}

        def decode(batch: list[str]) -> float:
            seconds, sampled = timed_step(engine, [StepRow(s, feed[s]) for s in batch])
            feed.update({s: [t] for s, t in zip(batch, sampled)})
            return seconds

        sizes = sorted({1, max(1, max_batch // 2), max_batch})
        decode_s = {b: statistics.median(decode(ids[:b]) for _ in range(samples)) for b in sizes}
        middle = max(1, max_batch // 2) - 1  # decode rows beside the extending one
        extra: dict[int, float] = {}
        offset = context
        for k in extends:
            runs = []
            for _ in range(samples):
                base = decode(ids[:middle + 1])  # the extending sequence decodes too: same b + 1 rows
                chunk = tokens[offset:offset + k]
                offset += k
                order = ids[1:middle + 1] + ids[:1]
                rows = [StepRow(s, feed[s]) for s in order[:-1]]
                rows.append(StepRow(ids[0], feed[ids[0]][:1] + chunk[1:]))  # its pending token and k - 1 more
                seconds, sampled = timed_step(engine, rows)
                feed.update({s: [t] for s, t in zip(order, sampled)})
                runs.append(seconds - base)
            extra[k] = statistics.median(runs)
    finally:
        for seq_id in ids:
            engine.release(seq_id)
    per_token, arrival = fit_feed_cost(extra)
    curve = np.interp(range(1, max_batch + 1), sizes, [decode_s[b] for b in sizes])
    return {"decode_s": curve.tolist(), "per_token_s": per_token, "arrival_s": arrival,
            "extend_extra_s": {str(k): v for k, v in extra.items()}}


def fit_feed_cost(extra: dict[int, float]) -> tuple[float, float]:
    """(per_token, arrival) with extra(k) ~ arrival + per_token (k - 1), least squares, both clamped at >= 0."""
    if len(extra) < 2:
        raise ValueError(f"the fit needs at least two extend sizes, got {sorted(extra)}")
    ks = np.array(sorted(extra), dtype=float)
    slope, intercept = np.polyfit(ks - 1, [extra[int(k)] for k in ks], 1)
    return max(0.0, float(slope)), max(0.0, float(intercept))


def pair_file(costs: dict[str, dict[str, Any]], models: Sequence[str], *, rate: float | None, N: int,
              prompt_tokens: tuple[int, int] | None, output_tokens: int | None) -> dict[str, Any]:
    """The `tokenrouter throughput --file` inputs: measured L per batch size, per-token and arrival costs
    (ms), and, where given, the random policy's P and C and the workload."""
    out: dict[str, Any] = {
        "L_ms": [[round(x * 1e3, 4) for x in costs[m]["decode_s"][:N]] for m in models],
        "per_token_ms": [round(costs[m]["per_token_s"] * 1e3, 5) for m in models],
        "arrival_ms": [round(costs[m]["arrival_s"] * 1e3, 4) for m in models],
        "delta_ms": round(max(costs[m]["decode_s"][N - 1] for m in models) * 1e3 / 100, 4),
        "N": N,
    }
    if rate is not None:
        if len(models) != 2:
            raise ValueError("--rate describes a pair (random routing small -> large)")
        out["P"], out["C"] = [[1 - rate, rate], [1.0, 0.0]], [[1, 0], [1, 0]]
    if prompt_tokens is not None and output_tokens is not None:
        out["prompt_tokens"], out["output_tokens"] = list(prompt_tokens), output_tokens
    return out
