"""vLLM benchmarks, side by side in one run, medians of interleaved reps.

``engines``: per model, our vLLM step engine (the adapter, in-process as in a Triton stub) vs vLLM's
own continuous-batching loop on the very same engine object (the ceiling: what ``LLM.generate``
runs) vs our PyTorch engine, greedy, at batch 1 / 8 / 16 with mixed prompt lengths; then the
resume cost of a pending request (extend k = 1..4) against a decode step. Each model is measured
in a worker process of its own, so the 1.5B never shares memory with the 0.5B.

``routing``: the number a user decides by. TokenRouter on vLLM (both models, one process each,
pinned to a core each) against the large model alone on vLLM's own engine (both cores), the same
HumanEval chat prompts, N concurrent requests, greedy, same stop ids.

``serving``: what a user would run instead, each behind its OpenAI API and driven by the same
closed-loop client: TokenRouter served (the OpenAI server beside Triton), Std. Serving on two real
vLLM OpenAI servers with an external one-token-per-call dispatcher, and the large model alone on one
vLLM OpenAI server with both cores (``bench/vllm_serving.py``).

``dtypes``: per model, the vLLM step engine in bfloat16 against float32, two engine
processes of the same model side by side, reps interleaved: prefill, decode at batch 1 and 8,
extend k = 1..4 after a pause, and how many greedy rows agree.

    tokenrouter bench-vllm engines --models small large --reps 3 --json results/bench_vllm_engines.json
    tokenrouter bench-vllm routing --clients 8 --requests 16 --reps 3
    tokenrouter bench-vllm dtypes --threads 1 --reps 3
    tokenrouter bench-vllm serving --concurrency 1 4 8 --requests 164 --max-tokens 64 --reps 3 \
        --policy random --policy-params '{"rate": 0.2}' --plot docs/benchmarks/vllm-serving.png
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from tokenrouter.config import ModelSpec, load_config
from tokenrouter.engine.dtypes import resolve_dtype
from tokenrouter.engine.factory import create_engine
from tokenrouter.engine.process_engine import EngineProcess
from tokenrouter.launch.paths import shipped_config

from .bench.routing_systems import (Requests, embedded_tokenrouter, identical_rows, large_alone, served_tokenrouter,
                                   timed)
from .bench.plots import plot_vllm_serving
from .bench.report import machine
from .bench.runner import Timing
from .bench.vllm_serving import SYSTEMS as SERVING_SYSTEMS
from .bench.vllm_serving import report as report_serving
from .bench.vllm_serving import run_serving
from .bench.workloads import Workload
from .bench_engine import BATCH8_LENGTHS, BATCH1_LENGTH, RESUME_PREFIX, code_prompts, engine_generate, resume_cost

BATCHES = {1: (BATCH1_LENGTH,), 8: BATCH8_LENGTHS, 16: BATCH8_LENGTHS + tuple(n + 8 for n in BATCH8_LENGTHS)}
DEFAULT_CONFIG = shipped_config("qwen2.5-coder.yaml")


# --- engines: adapter vs vLLM's own loop vs our torch engine ----------------------------------------
def engine_worker(member: str, path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Runs in a process of its own (see ``run``): vLLM in-process, the torch engine beside it."""
    from transformers import AutoTokenizer

    from tokenrouter.engine.vllm_engine import VLLMEngine

    common = dict(path=str(path), dtype=args.dtype, threads=args.threads, kv_cache_tokens=16384, max_batch_size=16,
                  max_prefill_tokens=4096)
    # One dtype for all three systems (``auto`` resolved as vLLM resolves it), so their rows compare.
    common["dtype"] = resolve_dtype(ModelSpec(engine="vllm", **common), on_gpu=False)
    vllm = create_engine(member, ModelSpec(engine="vllm", **common), owns_process=True)
    assert isinstance(vllm, VLLMEngine)  # for ``generate_natively``, vLLM's own loop
    torch_engine = create_engine(member, ModelSpec(engine="torch", block_size=16, **common), owns_process=True)
    tokenizer = AutoTokenizer.from_pretrained(path)
    systems: dict[str, Callable[[list[list[int]], int], tuple[list[list[int]], int]]] = {
        "adapter": lambda prompts, n: (engine_generate(vllm, prompts, n), n),
        "native": lambda prompts, n: vllm.generate_natively(prompts, n),
        "torch": lambda prompts, n: (engine_generate(torch_engine, prompts, n), n),
    }
    warm = code_prompts(tokenizer, [16])
    for system in systems.values():  # first calls allocate; vLLM's first step is cold
        system(warm, 2)
    result: dict[str, Any] = {"member": member, "path": str(path), "threads": args.threads, "batches": {}}
    for batch in args.batches:
        c = compare_systems(systems, code_prompts(tokenizer, BATCHES[batch]), args.new_tokens, args.reps)
        c.update(adapter_vs_native=paired_speedup(c["all_times"], "adapter", "native"),
                 adapter_vs_torch=paired_speedup(c["all_times"], "adapter", "torch"))
        result["batches"][batch] = c
    if args.resume:
        result["resume_ms"] = resume_cost(vllm, code_prompts(tokenizer, [RESUME_PREFIX])[0], args.reps)
    return result


def compare_systems(systems: dict, prompts: list[list[int]], new_tokens: int, reps: int) -> dict[str, Any]:
    """Interleaved reps (rotating which system goes first), medians, and how many rows agree with
    the first system's."""
    times: dict[str, list[float]] = {name: [] for name in systems}
    steps: dict[str, int] = {}
    outputs: dict[str, list[list[int]]] = {}
    names = list(systems)
    for rep in range(reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            start = time.perf_counter()
            outputs[name], steps[name] = systems[name](prompts, new_tokens)
            times[name].append(time.perf_counter() - start)
            print(f"  batch {len(prompts)} rep {rep} {name}: {times[name][-1]:.2f} s", file=sys.stderr, flush=True)
    tokens = len(prompts) * new_tokens
    median = {name: statistics.median(values) for name, values in times.items()}
    return {
        "batch": len(prompts),
        "new_tokens": new_tokens,
        "seconds": median,
        "tok_s": {name: tokens / seconds for name, seconds in median.items()},
        "step_ms": {name: 1000 * median[name] / steps[name] for name in systems},
        "rows_identical": {name: sum(a == b for a, b in zip(outputs[names[0]], outputs[name])) for name in systems},
        "all_times": times,
    }


def paired_speedup(times: dict[str, list[float]], system: str, baseline: str) -> float:
    """How many times faster ``system`` ran than ``baseline``: the median over reps whose runs were
    back to back, which is robust to load drift on a shared machine."""
    return statistics.median(b / s for s, b in zip(times[system], times[baseline]))


# --- dtypes: the vLLM step engine in bfloat16 vs float32 --------------------------------------------
DTYPES = ("float32", "bfloat16")
PREFILL_BATCH = (400,) * 8  # 8 x 400-token prefill


def compare_dtypes(member: str, path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Both dtypes of one model, each in an engine process pinned to the same cores, never running
    at once. Decode ms per step = (time of prefill + n tokens - time of the prefill alone) / (n - 1)."""
    from transformers import AutoTokenizer

    common = dict(path=str(path), engine="vllm", threads=args.threads, cpus=list(range(args.threads)),
                  kv_cache_tokens=16384, max_batch_size=16, max_prefill_tokens=4096)
    engines = {dtype: EngineProcess(f"{member}-{dtype}", ModelSpec(dtype=dtype, **common)) for dtype in DTYPES}
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        systems = {dtype: (lambda prompts, n, e=engine: (engine_generate(e, prompts, n), n))
                   for dtype, engine in engines.items()}
        for system in systems.values():
            system(code_prompts(tokenizer, [16]), 2)  # first steps allocate
        result: dict[str, Any] = {"member": member, "threads": args.threads, "batches": {}}
        prefill = compare_systems(systems, code_prompts(tokenizer, PREFILL_BATCH), 1, args.reps)
        result["prefill_8x400_ms"] = {d: 1000 * s for d, s in prefill["seconds"].items()}
        result["prefill_speedup"] = paired_speedup(prefill["all_times"], "bfloat16", "float32")
        for batch in (1, 8):
            prompts = code_prompts(tokenizer, BATCHES[batch])
            first = compare_systems(systems, prompts, 1, args.reps)
            whole = compare_systems(systems, prompts, args.new_tokens, args.reps)
            decode_ms = {d: 1000 * (whole["seconds"][d] - first["seconds"][d]) / (args.new_tokens - 1)
                         for d in DTYPES}
            result["batches"][batch] = {"decode_ms": decode_ms, "decode_speedup": decode_ms["float32"]
                                        / decode_ms["bfloat16"], "rows_identical": whole["rows_identical"]["bfloat16"],
                                        "generate": whole}
        prefix = code_prompts(tokenizer, [RESUME_PREFIX])[0]
        samples: dict[str, list[dict[str, float]]] = {d: [] for d in DTYPES}
        for _ in range(args.reps):  # interleaved, one rep each at a time
            for dtype in DTYPES:
                samples[dtype].append(resume_cost(engines[dtype], prefix, 1))
        result["resume_ms"] = {d: {k: statistics.median(s[k] for s in runs) for k in runs[0]}
                               for d, runs in samples.items()}
        return result
    finally:
        for engine in engines.values():
            engine.close()


# --- routing: TokenRouter on vLLM vs the large model alone on vLLM --------------------------------
def routing_requests(config_path: Path, count: int, max_tokens: int) -> Requests:
    """HumanEval problems as `tokenrouter quality` prompts them (a chat turn with the answer begun
    as the problem's code, so the policies route as in docs/quality.md), as ids and as the text a
    client sends; and the end ids."""
    from tokenrouter.text import TextCodec

    from .quality_bench.humaneval import load_problems, prompt_text

    config = load_config(config_path)
    if config.tokenizer_path is None:
        raise SystemExit(f"{config_path}: no tokenizer (set `tokenizer`, or a `path` on the entry model)")
    codec = TextCodec.from_path(config.tokenizer_path, chat_template=True)  # end ids: <|im_end|> too
    # The prefill prompt renders its own chat turn: encode it as it is.
    texts = [prompt_text(p, "prefill", codec.tokenizer) for p in load_problems(count, sample_seed=0)]
    ids = [codec.tokenizer.encode(text, add_special_tokens=False) for text in texts]
    return Requests(ids, texts, codec.end_ids(), max_tokens)


def serving(args: argparse.Namespace) -> dict[str, Any]:
    requests = routing_requests(args.config, args.requests, args.max_tokens)
    config = load_config(routed_config(args, max(args.concurrency)))
    workload = Workload("short-long", (0, 0), args.max_tokens)
    start = machine()
    result = run_serving(config, requests.texts, requests.stop_ids, args.concurrency, workload,
                         Timing(args.warmup_s, args.measure_s), reps=args.reps, cores=args.cores, systems=args.systems,
                         progress=lambda partial: write_results(args.json, {"machine": start, **partial}))
    return {"machine": start, "machine_at_end": machine(), **result}


def routed_config(args: argparse.Namespace, clients: int | None = None) -> dict[str, Any]:
    """The pair's config with both models on vLLM, one core each, ``clients`` (default --clients) at once."""
    clients = clients or args.clients
    config = load_config(args.config).model_dump()
    for index, spec in enumerate(config["models"].values()):
        spec.update(engine="vllm", block_size=32, threads=1, cpus=[index % args.cores], max_batch_size=clients)
        spec.pop("batch_threshold", None)
    config["policy"] = {"name": args.policy, "params": json.loads(args.policy_params), "weights": None}
    config["scheduling"].update(max_active=clients)
    return config


def run_routing(args: argparse.Namespace) -> dict[str, Any]:
    """Each rep loads every system afresh in a rotating order (they do not fit in memory together),
    so the systems' runs alternate and a slow minute of a shared machine hits one rep, not one system."""
    requests = routing_requests(args.config, args.requests, args.max_tokens)
    config = load_config(routed_config(args))
    systems: dict[str, Callable[[], Any]] = {"tokenrouter": lambda: embedded_tokenrouter(config)}
    if args.served:
        systems["tokenrouter_served"] = lambda: served_tokenrouter(config, args.clients)
    systems["large_alone"] = lambda: large_alone(config, args.clients, args.cores)
    warm = Requests(requests.ids[:2], requests.texts[:2], requests.stop_ids, 4)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in systems}
    tokens: dict[str, list[list[int]]] = {}
    names = list(systems)
    for rep in range(args.reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            with systems[name]() as generate:
                generate(warm)  # the first steps are cold
                seconds, outputs = timed(generate, requests)
            tokens[name] = outputs.tokens
            runs[name].append({"seconds": seconds, "tokens": outputs.total, "tok_s": outputs.total / seconds,
                               "large_share": outputs.large_tokens / max(outputs.total, 1)})
            print(f"  rep {rep} {name}: {outputs.total / seconds:.1f} tok/s, large share "
                  f"{runs[name][-1]['large_share']:.3f}", file=sys.stderr, flush=True)
    median = {name: statistics.median(r["tok_s"] for r in values) for name, values in runs.items()}
    speedups = {name: statistics.median(r["tok_s"] / b["tok_s"] for r, b in zip(runs[name], runs["large_alone"]))
                for name in names if name != "large_alone"}
    return {"clients": args.clients, "requests": len(requests.ids), "max_tokens": args.max_tokens,
            "policy": config.policy.model_dump(), "dtypes": {n: resolve_dtype(s, on_gpu=False)
                                                              for n, s in config.models.items()},
            "tok_s": median, "large_share": {n: statistics.median(r["large_share"] for r in runs[n]) for n in names},
            "speedup": speedups, "runs": runs,
            "identical_rows": {n: identical_rows(tokens[n], tokens["tokenrouter"]) for n in names}}


# --- report, CLI --------------------------------------------------------------------------------------
def report_engines(results: list[dict]) -> str:
    lines = ["| model | batch | adapter tok/s | vLLM native tok/s | torch tok/s | adapter / native (paired) "
             "| adapter / torch (paired) | ms/step adapter | ms/step native | identical rows (native, torch) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        for c in r["batches"].values():
            t, s, same = c["tok_s"], c["step_ms"], c["rows_identical"]
            lines.append(f"| {r['member']} | {c['batch']} | {t['adapter']:.1f} | {t['native']:.1f} | {t['torch']:.1f} "
                         f"| {c['adapter_vs_native']:.2f}x | {c['adapter_vs_torch']:.2f}x | {s['adapter']:.0f} "
                         f"| {s['native']:.0f} | {same['native']}/{c['batch']}, {same['torch']}/{c['batch']} |")
    lines += ["",
              "| model | decode step ms | extend k=1 | k=2 | k=3 | k=4 | worst extend / decode | prefill prefix+1 |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        m = r.get("resume_ms")
        if m:
            worst = max(m[f"extend_{k}"] for k in range(1, 5)) / m["decode_1"]
            lines.append(f"| {r['member']} | {m['decode_1']:.0f} | " + " | ".join(f"{m[f'extend_{k}']:.0f}" for k in
                         range(1, 5)) + f" | {worst:.2f}x | {m['prefill_prefix+1']:.0f} |")
    return "\n".join(lines)


def report_dtypes(results: list[dict]) -> str:
    lines = ["| model | dtype | prefill 8 x 400 ms | decode ms/step batch 1 | batch 8 | extend k=1 | k=4 "
             "| decode after 512 |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        b, m = r["batches"], r["resume_ms"]
        for d in DTYPES:
            lines.append(f"| {r['member']} | {d} | {r['prefill_8x400_ms'][d]:.0f} | {b[1]['decode_ms'][d]:.0f} "
                         f"| {b[8]['decode_ms'][d]:.0f} | {m[d]['extend_1']:.0f} | {m[d]['extend_4']:.0f} "
                         f"| {m[d]['decode_1']:.0f} |")
        ratio = {k: m["float32"][k] / m["bfloat16"][k] for k in ("extend_1", "extend_4", "decode_1")}
        lines.append(f"| {r['member']} | bf16 speedup | {r['prefill_speedup']:.2f}x | {b[1]['decode_speedup']:.2f}x "
                     f"| {b[8]['decode_speedup']:.2f}x | {ratio['extend_1']:.2f}x | {ratio['extend_4']:.2f}x "
                     f"| {ratio['decode_1']:.2f}x |")
    lines.append("\ngreedy rows identical, bfloat16 vs float32: " + ", ".join(
        f"{r['member']} batch {batch}: {c['rows_identical']}/{batch}"
        for r in results for batch, c in r["batches"].items()))
    return "\n".join(lines)


ROUTING_LABELS = {"tokenrouter": "TokenRouter on vLLM, embedded", "tokenrouter_served": "TokenRouter on vLLM, served "
                  "(Triton gRPC)", "large_alone": "large model alone, vLLM's own loop"}


def report_routing(r: dict) -> str:
    policy = f"{r['policy']['name']} {json.dumps(r['policy']['params'])}"
    lines = [f"N = {r['clients']}, {r['requests']} requests, max_tokens {r['max_tokens']}, policy {policy}, "
             f"dtypes {r['dtypes']}", "",
             "| system | tok/s per rep | tok/s (median) | large share | / large alone (paired median) "
             "| rows identical to embedded |", "| --- | --- | --- | --- | --- | --- |"]
    for name, runs in r["runs"].items():
        speedup = r["speedup"].get(name)
        per_rep = ", ".join(f"{x['tok_s']:.1f}" for x in runs)
        lines.append(f"| {ROUTING_LABELS[name]} | {per_rep} "
                     f"| {r['tok_s'][name]:.1f} | {r['large_share'][name]:.3f} "
                     f"| {'-' if speedup is None else f'{speedup:.2f}x'} "
                     f"| {r['identical_rows'][name]}/{r['requests']} |")
    return "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("part", choices=("engines", "routing", "dtypes", "serving"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--models", nargs="+", default=["small", "large"],
                        help="engines, dtypes: which models of the pair (default small large)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 16], choices=sorted(BATCHES))
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2, help="engines, dtypes: threads per engine")
    parser.add_argument("--dtype", default="auto", choices=("auto", *DTYPES), help="engines: the vLLM engine's dtype")
    parser.add_argument("--no-resume", dest="resume", action="store_false", help="engines: skip the resume cost")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="routing: the model pair and stops")
    parser.add_argument("--clients", type=int, default=8, help="routing: concurrent requests N")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    # The default routes a fixed ~10 % of tokens: the share the target is stated at. A
    # signal-driven policy's share moves with the workload (GlimpRouter at 0.01 routed 41 % here).
    parser.add_argument("--policy", default="random")
    parser.add_argument("--policy-params", default='{"rate": 0.1}',
                        help="JSON; default: 10 %% of tokens to the large model")
    parser.add_argument("--cores", type=int, default=2, help="routing: cores to spread the models over")
    parser.add_argument("--served", action="store_true", help="routing: also TokenRouter served by Triton over gRPC")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8], help="serving: N, closed-loop clients")
    parser.add_argument("--systems", nargs="+", default=list(SERVING_SYSTEMS), choices=SERVING_SYSTEMS)
    parser.add_argument("--warmup-s", type=float, default=10.0, help="serving: before each window")
    parser.add_argument("--measure-s", type=float, default=40.0, help="serving: each measurement window")
    parser.add_argument("--plot", type=Path, help="serving: a PNG of throughput, TTFT and per-user speed over N")
    parser.add_argument("--worker", nargs=2, metavar=("MODEL", "PATH"), help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    if args.worker:  # one model's engines part, in its own process
        print(json.dumps(engine_worker(args.worker[0], Path(args.worker[1]), args)))
        return 0
    if args.part == "routing":
        result: Any = run_routing(args)
        print(report_routing(result))
    elif args.part == "serving":
        result = serving(args)
        print(report_serving(result))
        if args.plot:
            plot_vllm_serving(result, args.plot)
    elif args.part == "dtypes":
        from tokenrouter_engines.models import model_dirs

        result = []
        for member in args.models:
            result.append(compare_dtypes(member, model_dirs()[member], args))
            write_results(args.json, result)
        print(report_dtypes(result))
    else:
        from tokenrouter_engines.models import model_dirs

        result = []
        for member in args.models:  # each model's results are kept as soon as its worker is done
            result.append(run_worker(member, model_dirs()[member], args))
            write_results(args.json, result)
        print(report_engines(result))
    write_results(args.json, result)
    return 0


def write_results(path: Path | None, result: Any) -> None:
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1))


def run_worker(member: str, path: Path, args: argparse.Namespace) -> dict[str, Any]:
    argv = [sys.executable, "-m", "tokenrouter_tools.bench_vllm", "engines", "--worker", member, str(path),
            "--reps", str(args.reps), "--new-tokens", str(args.new_tokens), "--threads", str(args.threads),
            "--dtype", args.dtype, "--batches", *map(str, args.batches)] + ([] if args.resume else ["--no-resume"])
    out = subprocess.run(argv, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
