"""A model's step cost at tensor-parallel size 1 and 2 on vLLM's CPU backend, and what the cross-rank
capture adds to a step, side by side, medians of interleaved reps.

Per size, one engine (a process of its own; at TP 2 its two worker processes, one core each; at TP 1
one core): the same prompts decoded greedily (a) by our step adapter, which fetches every step's
logits from rank 0, and (b) by vLLM's own continuous-batching loop on the same engine (what
``LLM.generate`` runs: no fetch, no sessions), alternating a and b in each rep. ``fetch`` is the time
our adapter spent in the rank-0 fetch per step (``last_fetch_s``), the part of the capture that vLLM's
own step does not have; the wrap inside ``compute_logits`` (one copy of the rows' logits and hidden
states on rank 0) runs in both loops. The adapter's steps are timed in this process, each one a call
to the engine's process (its logits come back through shared memory); vLLM's loop runs whole in the
engine's process: ``adapter_over_native`` includes that round trip and the sessions' work.

    python -m tokenrouter_tools.bench_tensor_parallel --model engines/build/tiny/qwen3-seed0/large --reps 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any, Sequence

from tokenrouter.config import ModelSpec
from tokenrouter.engine.base import StepRow
from tokenrouter.engine.factory import create_engine


def prompts_for(batch: int, vocab: int, length: int = 24) -> list[list[int]]:
    return [[(97 * row + 31 * i) % (vocab - 8) + 3 for i in range(length + row)] for row in range(batch)]


def adapter_run(engine: Any, prompts: list[list[int]], tokens: int) -> tuple[float, float, list[list[int]]]:
    """Our step adapter, prefill then decodes: (seconds per step, fetch seconds per step, tokens)."""
    ids = list(range(len(prompts)))
    for i in ids:
        engine.add_sequence(i)
    feeds, fetch, elapsed = dict(zip(ids, prompts)), 0.0, 0.0
    out: list[list[int]] = [[] for _ in ids]
    for _ in range(tokens):
        start = time.perf_counter()
        result = engine.step([StepRow(i, feed) for i, feed in feeds.items()])
        elapsed += time.perf_counter() - start
        fetch += engine.call("last_fetch_s")  # a round trip to the engine's process, not timed
        for i, token in zip(result.seq_ids, result.sampled.tolist()):
            out[i].append(token)
            feeds[i] = [token]
    for i in ids:
        engine.release(i)
    return elapsed / tokens, fetch / tokens, out


def native_run(engine: Any, prompts: list[list[int]], tokens: int) -> tuple[float, list[list[int]]]:
    """vLLM's own loop on the same engine: (seconds per step, tokens)."""
    start = time.perf_counter()
    out, steps = engine.call("generate_natively", prompts, tokens)
    return (time.perf_counter() - start) / steps, out


def measure(path: Path, ranks: int, batches: Sequence[int], tokens: int, reps: int) -> dict[str, Any]:
    spec = ModelSpec(path=str(path), engine="vllm", dtype="float32", kv_cache_tokens=8192, max_batch_size=16,
                     tensor_parallel_size=ranks, threads=1, cpus=list(range(ranks)))
    engine = create_engine(f"tp{ranks}", spec)
    try:
        results: dict[str, Any] = {}
        for batch in batches:
            prompts = prompts_for(batch, engine.vocab_size)
            adapter_run(engine, prompts, 2)  # warm-up: the first steps are cold
            times: dict[str, list[float]] = {"adapter": [], "native": [], "fetch": []}
            same = True
            for _ in range(reps):
                step, fetch, ours = adapter_run(engine, prompts, tokens)
                native, theirs = native_run(engine, prompts, tokens)
                times["adapter"].append(step)
                times["fetch"].append(fetch)
                times["native"].append(native)
                same &= ours == theirs
            medians = {key: statistics.median(values) * 1000 for key, values in times.items()}
            results[f"batch_{batch}"] = {**{f"{key}_ms": round(value, 3) for key, value in medians.items()},
                                         "fetch_share_of_native": round(medians["fetch"] / medians["native"], 4),
                                         "adapter_over_native": round(medians["adapter"] / medians["native"], 3),
                                         "same_tokens": same}
        return results
    finally:
        engine.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="an HF model folder")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--tokens", type=int, default=24, help="steps per run (the first is the prefill)")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    report = {f"tp{ranks}": measure(args.model, ranks, args.batches, args.tokens, args.reps) for ranks in (1, 2)}
    for batch in args.batches:
        one, two = report["tp1"][f"batch_{batch}"], report["tp2"][f"batch_{batch}"]
        report[f"tp2_over_tp1_batch_{batch}"] = round(two["adapter_ms"] / one["adapter_ms"], 3)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
