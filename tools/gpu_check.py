"""Device check: the engines and the routed runtime on a GPU, as one JSON report and a summary table.

    python3 tools/gpu_check.py --out gpu-report.json   # CUDA, one GPU; no part starts after --budget-s (420 s)
    tools/gpu_check_device.sh                          # the same on a lent GPU machine, report under $OUT
    python3 tools/gpu_check.py --cpu                   # the CPU miniature CI runs
    python3 tools/gpu_check.py --skip-vllm --models qwen2.5-0.5b --budget-s 120

Checks (each reports passed, or why it did not run):
  torch engine, exact (tiny pair, float32, on the device): greedy == transformers generate; a resume
    feeds only its new tokens; routed greedy output == the naive reference (runtime/reference.py);
  torch engine, speed (Qwen2.5 0.5B/1.5B/7B shapes, random weights, bfloat16): decode ms/step, a
    long prefill next to decodes, the SDPA kernel; TokenRouter vs the large model alone at N = 8, 32;
  vLLM engine (when vllm imports): loads on the installed vLLM with the V1 runner and synchronous
    scheduling; the exact checks again, with vLLM's own counters for the resume; captured logits ==
    vLLM's sampler log-probabilities (with CUDA graphs on GPU); adapter vs vLLM's own loop at batch
    8 and 32; TokenRouter vs the large model alone on vLLM; where two or more GPUs are visible, the
    exact checks again with the large model at tensor-parallel size 2 (skipped, saying so, on one GPU).

Needs torch, transformers and tokenizers; runs from a checkout without an install. The vLLM parts
also need vllm (and pydantic, which vLLM brings). Stdout carries the JSON report alone; the
summary table goes to stderr, ending in one verdict line. Exit status (gpu_check_report.verdict): 0 when
every check ran and passed, 1 when a check failed or raised, 2 when no CUDA device is visible (nothing
ran), 3 when nothing failed but a part was skipped (vLLM absent, --skip-vllm, the budget spent): a
skip is never a pass, and each says why.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]


def _import_from_checkout() -> None:
    """Without an install (a bare GPU host, the device machine), import the packages from this
    checkout under their installed names; engine child processes find tokenrouter by PYTHONPATH."""
    if importlib.util.find_spec("tokenrouter") is None:
        backend = str(ROOT / "backends" / "python_router")
        sys.path.insert(0, backend)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [backend, os.environ.get("PYTHONPATH")]))
    for name, folder in (("tokenrouter_engines", ROOT / "engines"), ("tokenrouter_tools", ROOT / "tools")):
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            spec = importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                          submodule_search_locations=[str(folder)])
            assert spec is not None and spec.loader is not None  # a .py file always gets a source loader
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)


_import_from_checkout()

import torch  # noqa: E402

from tokenrouter_tools.gpu_check_common import (  # noqa: E402
    QWEN25_SHAPES,
    Budget,
    Plan,
    load_model,
    mixed_prompts,
    run_part,
    skipped,
    tiny_pair,
)
from tokenrouter_tools.gpu_check_report import summary, verdict  # noqa: E402


def environment(plan: Plan) -> dict[str, Any]:
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "device": plan.device, "dtype": str(plan.dtype)}
    if plan.device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        env |= {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                "capability": f"{props.major}.{props.minor}", "cuda": torch.version.cuda,
                "driver_visible_gpus": torch.cuda.device_count()}
    return env


def check_torch(plan: Plan, budget: Budget, report: dict[str, Any], save: Callable[[], None]) -> None:
    """The torch engine, into ``report`` part by part (``save`` after each): the exact and routed checks
    on the tiny pair, the routed benchmark, then each real shape's speed."""
    from tokenrouter_tools.gpu_check_torch import check_shape, exact_torch_checks

    pair = run_part(lambda: tiny_pair(plan.family), budget)
    if "small" not in pair:
        report["tiny_pair"] = pair  # not built (the budget, an error): the report says why
        return
    parts: list[tuple[str, Callable[[], Any]]] = [
        ("exact", lambda: exact_torch_checks(pair, plan)),
        ("routed_equals_reference", lambda: routed_torch(pair, plan)),
        ("tokenrouter_vs_large_alone", lambda: bench_torch(pair, plan)),
    ]
    for name, part in parts:
        report[name] = run_part(part, budget)
        save()
    report["shapes"] = {}
    for shape in plan.models:
        report["shapes"][shape] = run_part(lambda: check_shape(shape, plan, budget), budget)
        save()


def check_vllm(plan: Plan, budget: Budget) -> dict[str, Any]:
    """The vLLM engine's parts (skipped, saying why, where vllm does not import); imported inside the
    part so that a broken import is reported like any other failure, after the torch parts' report."""
    from tokenrouter_tools.gpu_check_vllm import check_vllm

    return check_vllm(plan, budget)


def torch_engines(models: dict[str, Any]) -> dict[str, Any]:
    from tokenrouter.engine.torch_engine import TorchEngine
    from tokenrouter_tools.gpu_check_common import BLOCK_SIZE

    return {name: TorchEngine(name, model, num_blocks=16384 // BLOCK_SIZE, block_size=BLOCK_SIZE)
            for name, model in models.items()}


def routed_torch(pair: dict[str, Path], plan: Plan) -> dict[str, Any]:
    from tokenrouter_tools.gpu_check_routed import routed_equals_reference

    models = {"slm": load_model(pair["small"], plan.device), "llm": load_model(pair["large"], plan.device)}
    engines = torch_engines(models)
    try:
        prompts = mixed_prompts(plan.exact_prompts, models["slm"].config.vocab_size, seed=41)
        return routed_equals_reference(engines, models, prompts, plan.exact_tokens, plan.route_rate)
    finally:
        for engine in engines.values():
            engine.close()


def bench_torch(pair: dict[str, Path], plan: Plan) -> dict[str, Any]:
    """TokenRouter on two torch engines against the large torch engine alone (all rows batched every step)."""
    from tokenrouter_tools.gpu_check_common import free_memory, random_model
    from tokenrouter_tools.gpu_check_routed import routed_vs_large_alone
    from tokenrouter_tools.gpu_check_torch import step_greedy

    if plan.bench_pair is None:
        models = {"slm": load_model(pair["small"], plan.device), "llm": load_model(pair["large"], plan.device)}
    else:
        models = {name: random_model(shape, plan.device, plan.dtype, seed=1)
                  for name, shape in zip(("slm", "llm"), plan.bench_pair)}
    engines = torch_engines(models)
    vocab = models["slm"].config.vocab_size
    longest = 256 if plan.bench_pair else 60
    try:
        report = routed_vs_large_alone(
            engines, lambda prompts, n: step_greedy(engines["llm"], prompts, n),
            lambda n: mixed_prompts(n, vocab, seed=51, shortest=16, longest=longest), plan.bench_clients,
            plan.bench_tokens, plan.bench_rate, plan.bench_reps)
    finally:
        for engine in engines.values():
            engine.close()
        engines.clear()  # frees them for free_memory (the lambdas above hold these dicts)
        models.clear()
        free_memory()
    return {"shapes": list(plan.bench_pair or ("tiny small", "tiny large")), **report}


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Whatever is written to stdout meanwhile goes to stderr, at the file descriptor: vLLM's engine
    processes log to the stdout they inherit, which Python's redirect_stdout does not reach."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


@contextlib.contextmanager
def timed(report: dict[str, Any]) -> Iterator[None]:
    start = time.perf_counter()
    yield
    report["wall_s"] = round(time.perf_counter() - start, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Our engines and runtime on a GPU (or --cpu), as a JSON report.")
    parser.add_argument("--cpu", action="store_true", help="tiny shapes on the CPU (CI)")
    parser.add_argument("--models", help=f"comma-separated subset of {', '.join(QWEN25_SHAPES)} (torch speed parts)")
    parser.add_argument("--skip-vllm", action="store_true", help="leave the vLLM engine out (reported as skipped)")
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="stop starting new parts after this many seconds (default 420)")
    parser.add_argument("--out", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    plan = Plan.for_device(args.cpu)
    if args.models:
        plan = plan.with_models(tuple(args.models.split(",")))
    if not args.cpu and not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible to torch (use --cpu for the CPU miniature)", file=sys.stderr)
        return 2
    budget = Budget(args.budget_s)
    report: dict[str, Any] = {"environment": environment(plan), "torch_engine": {}}

    def save() -> None:
        """The report so far, so that a run stopped from outside still leaves what it found."""
        if args.out:
            args.out.write_text(json.dumps(report, indent=2) + "\n")

    # stdout carries the report alone: libraries that log to stdout (vLLM) go to stderr meanwhile
    with timed(report), stdout_to_stderr():
        outcome = run_part(lambda: check_torch(plan, budget, report["torch_engine"], save), budget)
        if outcome is not None:  # the whole part did not run or raised
            report["torch_engine"] = outcome
        if args.skip_vllm:
            report["vllm_engine"] = skipped("--skip-vllm given")
        else:
            report["vllm_engine"] = run_part(lambda: check_vllm(plan, budget), budget)
    save()
    print(json.dumps(report, indent=2))
    print(summary(report), file=sys.stderr)
    return verdict(report)[0]


if __name__ == "__main__":
    raise SystemExit(main())
