"""What a tensor-parallel step sends back from rank 0: the full-vocabulary logits, or only what a
policy that reads none of them asks for (the sampled token, top-k, hidden states), side by side.

The model is widened to a real vocabulary first (``--vocab``, Qwen's 151,936 by default: the
embedding and LM head of a copy resized, the rest unchanged), so the rows weigh what they weigh on a
real pair. One engine at ``--tp`` ranks (one core each); per rep the same prompts are decoded
greedily twice, the steps asking for the logits (``full``) and not (``reduced``: what a policy with
``needs_logits = False`` gets), in alternating order. Per step: the rank-0 fetch (``last_fetch_s``),
the bytes it sent back (``last_fetch_bytes``) and the whole step as the runtime sees it (the engine
runs in a process of its own: full logits also cross that boundary). Medians of the reps.

    python -m tokenrouter_tools.bench_capture_fetch --model engines/build/tiny/qwen3-seed0/large --reps 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from tokenrouter.config import ModelSpec
from tokenrouter.engine.base import StepRow
from tokenrouter.engine.factory import create_engine

from .bench_tensor_parallel import prompts_for

QWEN_VOCAB = 151_936


def widened(model: Path, vocab: int, into: Path) -> Path:
    """A copy of ``model`` whose embedding and LM head have ``vocab`` rows (new rows random)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    network = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
    network.resize_token_embeddings(vocab, mean_resizing=False)
    network.save_pretrained(str(into))
    return into


def decode(engine: Any, prompts: list[list[int]], steps: int, return_logits: bool, top_k: int) -> dict[str, Any]:
    """Prefill then decodes; per-step medians of the fetch, its bytes and the step (decodes only)."""
    ids = list(range(len(prompts)))
    for i in ids:
        engine.add_sequence(i)
    feeds = dict(zip(ids, prompts))
    tokens: list[list[int]] = [[] for _ in ids]
    fetch, size, step = [], [], []
    for n in range(steps):
        start = time.perf_counter()
        result = engine.step([StepRow(i, feed) for i, feed in feeds.items()], top_logits=top_k,
                             return_logits=return_logits)
        elapsed = time.perf_counter() - start
        if n:  # the prefill's rows are the same size, its step is not a decode
            step.append(elapsed)
            fetch.append(engine.call("last_fetch_s"))  # a round trip to the engine's process, not timed
            size.append(engine.call("last_fetch_bytes"))
        for i, token in zip(result.seq_ids, result.sampled.tolist()):
            tokens[i].append(token)
            feeds[i] = [token]
    for i in ids:
        engine.release(i)
    return {"fetch_s": statistics.median(fetch), "bytes": statistics.median(size), "step_s": statistics.median(step),
            "tokens": tokens}


def measure(path: Path, ranks: int, batches: Sequence[int], steps: int, reps: int, top_k: int) -> dict[str, Any]:
    spec = ModelSpec(path=str(path), engine="vllm", dtype="float32", kv_cache_tokens=4096, max_batch_size=16,
                     tensor_parallel_size=ranks, threads=1, cpus=list(range(ranks)))
    engine = create_engine(f"tp{ranks}", spec)
    try:
        report: dict[str, Any] = {"vocab": engine.vocab_size, "tensor_parallel_size": ranks, "top_k": top_k}
        for batch in batches:
            prompts = prompts_for(batch, engine.vocab_size)
            decode(engine, prompts, 3, True, top_k)  # warm-up: the first steps are cold
            runs: dict[str, list[dict[str, Any]]] = {"full": [], "reduced": []}
            for rep in range(reps):
                for mode in (("full", "reduced") if rep % 2 == 0 else ("reduced", "full")):
                    runs[mode].append(decode(engine, prompts, steps, mode == "full", top_k))
            row: dict[str, Any] = {}
            for mode, results in runs.items():
                row[f"{mode}_fetch_ms"] = round(statistics.median(r["fetch_s"] for r in results) * 1e3, 3)
                row[f"{mode}_bytes"] = int(statistics.median(r["bytes"] for r in results))
                row[f"{mode}_step_ms"] = round(statistics.median(r["step_s"] for r in results) * 1e3, 3)
            row["fetch_full_over_reduced"] = round(row["full_fetch_ms"] / row["reduced_fetch_ms"], 2)
            row["bytes_full_over_reduced"] = round(row["full_bytes"] / row["reduced_bytes"], 1)
            row["step_full_over_reduced"] = round(row["full_step_ms"] / row["reduced_step_ms"], 3)
            row["same_tokens"] = all(r["tokens"] == runs["full"][0]["tokens"] for rs in runs.values() for r in rs)
            report[f"batch_{batch}"] = row
        return report
    finally:
        engine.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="an HF model folder")
    parser.add_argument("--vocab", type=int, default=QWEN_VOCAB, help="widen the model to this vocabulary (0: keep)")
    parser.add_argument("--tp", type=int, default=2, help="tensor_parallel_size")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--steps", type=int, default=12, help="steps per run (the first is the prefill)")
    parser.add_argument("--top-k", type=int, default=16, help="top-k logits each step asks for (R2R's 16)")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tokenrouter-wide-") as scratch:
        model = widened(args.model, args.vocab, Path(scratch)) if args.vocab else args.model
        report = measure(model, args.tp, args.batches, args.steps, args.reps, args.top_k)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
