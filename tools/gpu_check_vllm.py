"""The device check's vLLM parts: the vllm engine on the installed vLLM, checked exactly on the tiny
pair (float32), then measured on real shapes (random weights, the plan's dtype, CUDA graphs on GPU).

Each engine runs in a child process of its own (``create_engine``), as in the embedded API.
"""

from __future__ import annotations

import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence

import torch

from tokenrouter.engine.base import StepRow

from tokenrouter_tools.gpu_check_common import (
    Budget,
    Plan,
    free_memory,
    load_model,
    median,
    mixed_prompts,
    prompt,
    random_model,
    run_part,
    skipped,
    tiny_pair,
)
from tokenrouter_tools.gpu_check_routed import routed_equals_reference, routed_vs_large_alone
from tokenrouter_tools.gpu_check_torch import greedy_equals_generate, step_greedy

SAMPLER_LOGPROBS = 5
LOGPROB_TOLERANCE = 1e-3  # the same logits, log-softmaxed by vLLM's sampler and by us


def vllm_unavailable() -> str | None:
    """Why the vLLM parts cannot run here, or None."""
    try:
        import vllm  # noqa: F401
    except Exception as error:  # noqa: BLE001 (a broken install says why too)
        return f"vllm not importable: {type(error).__name__}: {error}"
    try:
        from tokenrouter.engine.vllm_compat import require_vllm_capabilities

        require_vllm_capabilities()
        import tokenrouter.config  # noqa: F401  (ModelSpec: pydantic, which vLLM brings)
    except Exception as error:  # noqa: BLE001
        return f"{type(error).__name__}: {error}"
    return None


def start_pair(paths: dict[str, Path], plan: Plan, dtype: str, *, max_batch: int, kv_tokens: int,
               share: float, large_ranks: int = 1) -> tuple[dict[str, Any], float]:
    """Both engines started at once, each in its own process, the large one over ``large_ranks``
    tensor-parallel ranks (GPUs 0 to large_ranks - 1); (engines, seconds)."""
    from tokenrouter.config import ModelSpec
    from tokenrouter.engine.factory import create_engine

    cpu = plan.device == "cpu"

    def start(size: str) -> Any:
        spec = ModelSpec(path=str(paths[size]), engine="vllm", dtype=dtype, device="cpu" if cpu else plan.device,
                         kv_cache_tokens=kv_tokens, max_batch_size=max_batch, max_prefill_tokens=4096,
                         threads=1 if cpu else None, gpu_memory_utilization=share,
                         tensor_parallel_size=large_ranks if size == "large" else 1)
        return create_engine(size, spec)

    begin = time.perf_counter()
    with ThreadPoolExecutor(len(paths)) as pool:
        futures = {size: pool.submit(start, size) for size in paths}
    engines = {}
    errors = []
    for size, future in futures.items():
        try:
            engines[size] = future.result()
        except Exception as error:  # noqa: BLE001
            errors.append(f"{size}: {error}")
    if errors:
        for engine in engines.values():
            engine.close()
        raise RuntimeError("vLLM engine start failed: " + "; ".join(errors))
    return engines, round(time.perf_counter() - begin, 1)


def resume_counts_only_new_tokens(engine: Any, vocab: int) -> dict[str, Any]:
    """vLLM's own counters: a pending request keeps its blocks and computed tokens; its resume with k
    tokens computes exactly k (next to a decode that computes 1)."""
    engine.add_sequence("away")
    engine.add_sequence("busy")
    try:
        first = engine.step([StepRow("away", prompt(80, vocab, seed=21)), StepRow("busy", prompt(30, vocab, 22))])
        blocks, computed = engine.call("block_ids", "away"), engine.call("computed_tokens", "away")
        last = int(first.sampled[1])
        for _ in range(3):
            last = int(engine.step([StepRow("busy", [last])]).sampled[0])
        kept = engine.call("block_ids", "away") == blocks and engine.call("computed_tokens", "away") == computed
        resume = [int(first.sampled[0]), *prompt(2, vocab, seed=23)]
        engine.step([StepRow("away", resume), StepRow("busy", [last])])
        scheduled = engine.call("last_step_tokens")
        after = engine.call("computed_tokens", "away")
    finally:
        engine.release("away")
        engine.release("busy")
    expected = {"away": len(resume), "busy": 1}
    return {"passed": kept and scheduled == expected and after == computed + len(resume),
            "blocks_and_computed_kept_while_pending": kept, "tokens_computed_on_resume_step": scheduled,
            "expected": expected, "computed_before_after": [computed, after]}


def logits_match_sampler(engine: Any, vocab: int) -> dict[str, Any]:
    """The captured logits of every row are the ones vLLM's own sampler worked on: its argmax is our
    greedy token and its top log-probabilities are log_softmax of our logits, in steps that mix
    prefills, decodes and an extend (on GPU: CUDA-graph replays for the decode steps)."""
    engine.call("record_sampler_logprobs", SAMPLER_LOGPROBS)
    worst, rows, agree = 0.0, 0, 0
    ids = ("a", "b", "c")
    for seq_id in ids:
        engine.add_sequence(seq_id)
    try:
        step_rows = [StepRow("a", prompt(40, vocab, 31)), StepRow("b", prompt(9, vocab, 32))]
        for index in range(6):
            result = engine.step(step_rows)
            recorded = engine.call("last_sampler_logprobs")
            logprobs = torch.log_softmax(result.logits.float(), dim=-1)
            for row, seq_id in enumerate(result.seq_ids):
                sampled, top = recorded[seq_id]
                rows += 1
                agree += sampled == int(result.logits[row].argmax()) == int(result.sampled[row])
                worst = max([worst] + [abs(float(logprobs[row, token]) - value) for token, value in top.items()])
            tokens = dict(zip(result.seq_ids, result.sampled.tolist()))
            step_rows = [StepRow(seq_id, [token]) for seq_id, token in tokens.items()]
            if index == 2:  # a late prefill and an extend with foreign tokens in one step
                step_rows = [StepRow("a", [tokens["a"], *prompt(3, vocab, 33)]), StepRow("b", [tokens["b"]]),
                             StepRow("c", prompt(17, vocab, 34))]
    finally:
        engine.call("record_sampler_logprobs", 0)
        for seq_id in ids:
            engine.release(seq_id)
    return {"passed": agree == rows and worst <= LOGPROB_TOLERANCE, "rows": rows, "argmax_agree": f"{agree}/{rows}",
            "max_abs_logprob_diff": worst, "tolerance": LOGPROB_TOLERANCE}


def exact_vllm_checks(engines: dict[str, Any], pair: dict[str, Path], plan: Plan, budget: Budget) -> dict[str, Any]:
    models = {size: load_model(path, plan.device) for size, path in pair.items()}
    vocab = engines["small"].vocab_size
    report: dict[str, Any] = {}
    for size, engine in engines.items():
        prompts = mixed_prompts(4, vocab, seed=11)
        report[f"greedy_equals_generate_{size}"] = run_part(
            lambda: greedy_equals_generate(engine, models[size], prompts, plan.exact_tokens), budget)
    large = engines["large"]
    report["resume_computes_only_new_tokens"] = run_part(lambda: resume_counts_only_new_tokens(large, vocab), budget)
    report["captured_logits_match_sampler_logprobs"] = run_part(lambda: logits_match_sampler(large, vocab), budget)
    report["routed_equals_reference"] = run_part(lambda: routed_equals_reference(
        {"slm": engines["small"], "llm": large}, {"slm": models["small"], "llm": models["large"]},
        mixed_prompts(plan.exact_prompts, vocab, seed=41), plan.exact_tokens, plan.route_rate), budget)
    models.clear()  # frees them for free_memory (the lambdas above hold this dict)
    free_memory()
    return report


def adapter_vs_native(engine: Any, prompts_for: Any, clients: Sequence[int], max_tokens: int,
                      reps: int) -> dict[str, Any]:
    """Greedy decoding of a batch: our step adapter (every step through the subserver's contract)
    against vLLM's own continuous-batching loop on the same engine, alternated rep by rep."""
    report: dict[str, Any] = {}
    step_greedy(engine, prompts_for(2), 4)  # warm-up
    engine.call("generate_natively", prompts_for(2), 4)
    for n in clients:
        prompts = prompts_for(n)
        times: dict[str, list[float]] = {"adapter": [], "native": []}
        outputs: dict[str, Any] = {}
        for rep in range(reps):
            runs = [("adapter", lambda: step_greedy(engine, prompts, max_tokens)),
                    ("native", lambda: engine.call("generate_natively", prompts, max_tokens)[0])]
            for name, run in runs if rep % 2 == 0 else runs[::-1]:
                start = time.perf_counter()
                outputs[name] = run()
                times[name].append(time.perf_counter() - start)
        tokens = n * max_tokens
        adapter, native = median(times["adapter"]), median(times["native"])
        same = sum(a == b for a, b in zip(outputs["adapter"], outputs["native"]))
        report[f"batch_{n}"] = {"adapter_tok_s": round(tokens / adapter, 1), "native_tok_s": round(tokens / native, 1),
                                "adapter_over_native": round(native / adapter, 3), "rows_equal": f"{same}/{n}"}
    return report


def random_pair(shapes: tuple[str, str], folder: Path, dtype: torch.dtype) -> dict[str, Path]:
    """Random-weight checkpoints of the benchmark's shapes, written for vLLM to load (on the CPU: the
    parent process keeps no GPU memory)."""
    paths = {}
    for size, shape in zip(("small", "large"), shapes):
        paths[size] = folder / size
        random_model(shape, "cpu", dtype, seed=1).save_pretrained(paths[size])
        free_memory()
    return paths


def bench_vllm(engines: dict[str, Any], plan: Plan, budget: Budget) -> dict[str, Any]:
    vocab = engines["small"].vocab_size
    longest = 256 if plan.bench_pair else 60

    def prompts_for(n: int) -> list[list[int]]:
        return mixed_prompts(n, vocab, seed=51, shortest=16, longest=longest)

    large = engines["large"]
    return {
        "captured_logits_match_sampler_logprobs": run_part(lambda: logits_match_sampler(large, vocab), budget),
        "adapter_vs_native": run_part(lambda: adapter_vs_native(large, prompts_for, plan.bench_clients,
                                                                plan.bench_tokens, plan.bench_reps), budget),
        "tokenrouter_vs_large_alone": run_part(lambda: routed_vs_large_alone(
            {"slm": engines["small"], "llm": large},
            lambda prompts, n: large.call("generate_natively", prompts, n), prompts_for, plan.bench_clients,
            plan.bench_tokens, plan.bench_rate, plan.bench_reps), budget),
    }


def check_vllm(plan: Plan, budget: Budget) -> dict[str, Any]:
    """Loads, exact checks, then the benchmark; each part reports on its own."""
    why = vllm_unavailable()
    if why:
        return skipped(why)
    import vllm

    report: dict[str, Any] = {"vllm_version": vllm.__version__}
    pair = tiny_pair(plan.family)
    exact_batch = max(plan.exact_prompts, 4)
    bench_batch = max(plan.bench_clients)
    engines, seconds = start_pair(pair, plan, "float32", max_batch=max(exact_batch, bench_batch), kv_tokens=8192,
                                  share=0.1)
    try:
        report["engine_loads"] = {"passed": True, "start_s": seconds,
                                  "settings": engines["large"].call("runner_settings")}
        report["exact"] = exact_vllm_checks(engines, pair, plan, budget)
        if plan.bench_pair is None:  # the CPU miniature measures the tiny pair it already runs
            report["bench"] = bench_vllm(engines, plan, budget)
    finally:
        for engine in engines.values():
            engine.close()
    report["tensor_parallel"] = run_part(lambda: check_tensor_parallel(pair, plan, budget), budget)
    if (shapes := plan.bench_pair) is not None:
        report["bench"] = run_part(lambda: bench_real_shapes(shapes, plan, budget), budget)
    return report


def check_tensor_parallel(pair: dict[str, Path], plan: Plan, budget: Budget) -> dict[str, Any]:
    """Where more than one GPU is visible: the exact checks again with the large tiny model at
    tensor-parallel size 2 (GPUs 0 and 1), its signals captured on rank 0 through vLLM's worker
    extension (with CUDA graphs: the sampler comparison holds them to vLLM's own sampler)."""
    if plan.device == "cpu":
        return skipped("the CPU miniature: tests/runtime/test_tensor_parallel_vllm.py runs TP 2 on CPU")
    gpus = torch.cuda.device_count()
    if gpus < 2:
        return skipped(f"{gpus} GPU visible: tensor parallelism needs two")
    engines, seconds = start_pair(pair, plan, "float32", max_batch=max(plan.exact_prompts, 4), kv_tokens=8192,
                                  share=0.1, large_ranks=2)
    try:
        settings = engines["large"].call("runner_settings")
        return {"engine_loads": {"passed": settings["tensor_parallel_size"] == 2, "start_s": seconds,
                                 "settings": settings},
                **exact_vllm_checks(engines, pair, plan, budget)}
    finally:
        for engine in engines.values():
            engine.close()


def bench_real_shapes(shapes: tuple[str, str], plan: Plan, budget: Budget) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as folder:
        paths = random_pair(shapes, Path(folder), plan.dtype)
        dtype = str(plan.dtype).removeprefix("torch.")
        kv_tokens = -(-max(plan.bench_clients) * (256 + plan.bench_tokens + 64) // 1024) * 1024
        engines, seconds = start_pair(paths, plan, dtype, max_batch=max(plan.bench_clients), kv_tokens=kv_tokens,
                                      share=0.3)
        try:
            report = {"shapes": list(shapes), "dtype": dtype, "start_s": seconds,
                      "settings": engines["large"].call("runner_settings")}
            report.update(bench_vllm(engines, plan, budget))
        finally:
            for engine in engines.values():
                engine.close()
    return report
