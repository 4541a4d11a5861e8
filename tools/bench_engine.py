"""Engine benchmark: the paged TorchEngine vs transformers ``generate`` on the very same weights.

For each model of a pair: greedy generation of N new tokens at batch 1 and at batch 8 with mixed
prompt lengths, engine and generate interleaved rep by rep (alternating which goes first, so load
drift on a shared machine hits both), medians and ratios; then the resume cost: extending a paused
request by k = 1..4 tokens vs one decode step vs prefilling its whole prefix again.

    python -m tokenrouter_tools.bench_engine --pair real --json results/bench_engine.json
    python -m tokenrouter_tools.bench_engine --pair tiny --reps 3
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import sysconfig
import time
from pathlib import Path
from typing import Callable, Sequence

import torch
from transformers import AutoTokenizer, GenerationConfig, PreTrainedTokenizerBase

from tokenrouter.config import ModelSpec
from tokenrouter.engine.base import Engine, StepRow
from tokenrouter.engine.loader import transformers_attention
from tokenrouter.engine.torch_engine import TorchEngine
from tokenrouter_engines.models import model_dirs
from tokenrouter_engines.tiny import ensure_tiny_pair

BATCH8_LENGTHS = (16, 40, 64, 100, 150, 200, 260, 320)
BATCH1_LENGTH = 128
RESUME_PREFIX = 512


def code_prompts(tokenizer: PreTrainedTokenizerBase, lengths: Sequence[int]) -> list[list[int]]:
    """Prompts of exactly the given token lengths, cut from different standard-library modules."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    prompts = []
    for i, length in enumerate(lengths):
        text = files[(7 * i + 3) % len(files)].read_text(encoding="utf-8", errors="replace")
        prompts.append(tokenizer(text[: 16 * length]).input_ids[:length])  # code runs < 16 chars a token
    assert [len(p) for p in prompts] == list(lengths), "a corpus file was too short for its prompt length"
    return prompts


def timed(fn: Callable[[], list[list[int]]]) -> tuple[list[list[int]], float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def engine_generate(engine: Engine, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """All prefills in one step, then decode steps over the whole batch; greedy, no EOS stop."""
    for i in range(len(prompts)):
        engine.add_sequence(i)
    outputs: list[list[int]] = [[] for _ in prompts]
    feeds = dict(enumerate(prompts))
    for _ in range(new_tokens):
        rows = [StepRow(i, tokens) for i, tokens in feeds.items()]
        for row, token in zip(rows, engine.step(rows).sampled.tolist()):  # in row order (Engine.step)
            outputs[row.seq_id].append(token)
            feeds[row.seq_id] = [token]
    for i in range(len(prompts)):
        engine.release(i)
    return outputs


def hf_generate(engine: TorchEngine, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """transformers ``generate`` on the engine's own model object, left-padded batch, greedy, no EOS stop."""
    width = max(len(p) for p in prompts)
    input_ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=[], pad_token_id=0)
    with transformers_attention(engine.model) as model, torch.inference_mode():
        out = model.generate(input_ids, attention_mask=mask, generation_config=config)
    return out[:, width:].tolist()


def compare(engine: TorchEngine, prompts: list[list[int]], new_tokens: int, reps: int) -> dict:
    """Interleaved reps of both; medians, speed ratio, and how many rows agree token for token."""
    times: dict[str, list[float]] = {"engine": [], "generate": []}
    runs = {"engine": engine_generate, "generate": hf_generate}
    outputs = {}
    for rep in range(reps):
        order = ["engine", "generate"] if rep % 2 == 0 else ["generate", "engine"]
        for name in order:
            outputs[name], seconds = timed(lambda: runs[name](engine, prompts, new_tokens))
            times[name].append(seconds)
            print(f"  batch {len(prompts)} rep {rep} {name}: {seconds:.2f} s", file=sys.stderr, flush=True)
    engine_s, generate_s = statistics.median(times["engine"]), statistics.median(times["generate"])
    tokens = len(prompts) * new_tokens
    return {
        "batch": len(prompts),
        "prompt_lengths": [len(p) for p in prompts],
        "new_tokens": new_tokens,
        "engine_s": engine_s,
        "generate_s": generate_s,
        "engine_tok_s": tokens / engine_s,
        "generate_tok_s": tokens / generate_s,
        "speedup": generate_s / engine_s,
        # Robust to load drift on a shared machine: each rep's pair ran back to back.
        "speedup_paired": statistics.median(g / e for g, e in zip(times["generate"], times["engine"])),
        "speedup_best": min(times["generate"]) / min(times["engine"]),
        "rows_identical": sum(a == b for a, b in zip(outputs["engine"], outputs["generate"])),
        "all_times": times,
    }


def resume_cost(engine: Engine, prefix: list[int], reps: int) -> dict[str, float]:
    """Median ms of: one decode step; an extend by k after a pause; a prefill of the prefix + k."""
    def step_ms(seq_id: str, tokens: list[int]) -> float:
        start = time.perf_counter()
        engine.step([StepRow(seq_id, tokens)])
        return 1000 * (time.perf_counter() - start)

    samples: dict[str, list[float]] = {}
    for _ in range(reps):
        engine.add_sequence("paused")
        engine.add_sequence("other")
        step_ms("paused", prefix)
        step_ms("other", prefix[:32])
        samples.setdefault("decode_1", []).append(step_ms("paused", [prefix[0]]))
        for k in range(1, 5):
            step_ms("other", [prefix[k]])  # "paused" sits out while another request decodes
            samples.setdefault(f"extend_{k}", []).append(step_ms("paused", prefix[1:1 + k]))
        engine.release("paused")
        for k in (1, 4):
            engine.add_sequence("fresh")
            samples.setdefault(f"prefill_prefix+{k}", []).append(step_ms("fresh", prefix + prefix[1:1 + k]))
            engine.release("fresh")
        engine.release("other")
    return {name: statistics.median(values) for name, values in samples.items()}


def bench_model(member: str, path: Path, args: argparse.Namespace) -> dict:
    spec = ModelSpec(path=str(path), dtype=args.dtype, threads=args.threads, block_size=16, kv_cache_tokens=8192)
    engine = TorchEngine.from_spec(member, spec)
    tokenizer = AutoTokenizer.from_pretrained(path)
    result = {"member": member, "path": str(path), "dtype": args.dtype, "threads": args.threads}
    engine_generate(engine, code_prompts(tokenizer, [16]), 2)  # warm-up: first-call allocations
    hf_generate(engine, code_prompts(tokenizer, [16]), 2)
    if "batch1" in args.parts:
        result["batch1"] = compare(engine, code_prompts(tokenizer, [BATCH1_LENGTH]), args.new_tokens, args.reps)
    if "batch8" in args.parts:
        result["batch8"] = compare(engine, code_prompts(tokenizer, BATCH8_LENGTHS), args.new_tokens, args.reps)
    if "resume" in args.parts:
        result["resume_ms"] = resume_cost(engine, code_prompts(tokenizer, [RESUME_PREFIX])[0], args.reps)
    engine.close()
    return result


def report(results: list[dict]) -> str:
    """Markdown tables, as pasted into docs/engine.md."""
    lines = ["| model | batch | engine tok/s | generate tok/s | speedup (medians) | speedup (paired) | speedup (best) "
             "| identical rows |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        for c in (r[key] for key in ("batch1", "batch8") if key in r):
            lines.append(f"| {r['member']} | {c['batch']} | {c['engine_tok_s']:.2f} | {c['generate_tok_s']:.2f} | "
                         f"{c['speedup']:.2f}x | {c['speedup_paired']:.2f}x | {c['speedup_best']:.2f}x | "
                         f"{c['rows_identical']}/{c['batch']} |")
    lines += ["", "| model | decode step ms | extend k=1 | k=2 | k=3 | k=4 | prefill prefix+1 | prefill prefix+4 |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        m = r.get("resume_ms")
        if m is None:
            continue
        extends = " | ".join(f"{m[f'extend_{k}']:.0f}" for k in range(1, 5))
        lines.append(f"| {r['member']} | {m['decode_1']:.0f} | {extends}"
                     f" | {m['prefill_prefix+1']:.0f} | {m['prefill_prefix+4']:.0f} |")
    return "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    """Options, in the shape tools/cli.py expects of a subcommand module."""
    parser.add_argument("--pair", choices=("real", "tiny"), default="real")
    parser.add_argument("--models", nargs="+", default=["small", "large"],
                        help="which models of the pair (default small large)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--parts", nargs="+", choices=("batch1", "batch8", "resume"),
                        default=["batch1", "batch8", "resume"])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads (on a busy shared machine, 1 avoids OpenMP barrier stalls)")
    parser.add_argument("--json", type=Path, help="also write the raw results here")


def run(args: argparse.Namespace) -> int:
    paths = model_dirs() if args.pair == "real" else ensure_tiny_pair("qwen2", 0)  # the real pair's family
    results = []
    for member in args.models:
        results.append(bench_model(member, paths[member], args))
        gc.collect()  # the 1.5B model is 7 GB in fp32: let the 0.5B go first
        print(json.dumps(results[-1], indent=1), flush=True)
    print(report(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
