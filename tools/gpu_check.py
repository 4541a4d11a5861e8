"""Device check: our torch engine (and the vLLM engine when present) on a GPU, as one JSON report.

    python tools/gpu_check.py                  # CUDA: Qwen2.5 0.5B/1.5B/7B shapes, about 5 minutes
    python tools/gpu_check.py --cpu            # tiny shapes on the CPU (what CI runs)
    python tools/gpu_check.py --out report.json --budget-s 420

Models have the real shapes with random weights (no download): the speed numbers hold for the
real checkpoints, greedy tokens do not mean anything beyond "engine == generate". Needs torch and
transformers; the vLLM part also needs vllm (and pydantic, which vLLM brings). Each part that does
not run says why in the report, never silently. The time budget skips what would not fit.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import platform
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

try:
    import tokenrouter  # noqa: F401  (installed, or the checkout's copy below)
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backends" / "python_router"))

import torch
from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config

from tokenrouter.engine.base import StepRow
from tokenrouter.engine.loader import transformers_attention
from tokenrouter.engine.torch_engine import TorchEngine

# Qwen2.5 architecture shapes (their config.json): hidden, intermediate, layers, heads, KV heads, vocab, tied.
QWEN25_SHAPES = {
    "qwen2.5-0.5b": (896, 4864, 24, 14, 2, 151936, True),
    "qwen2.5-1.5b": (1536, 8960, 28, 12, 2, 151936, True),
    "qwen2.5-7b": (3584, 18944, 28, 28, 4, 152064, False),
    "tiny": (128, 256, 2, 4, 2, 512, True),  # head_dim 32: the smallest vLLM's CPU attention accepts
}
BLOCK_SIZE = 16


@dataclass(frozen=True)
class Plan:
    """What to measure; the GPU plan follows issue 15, the CPU plan is its miniature."""

    device: str
    dtype: torch.dtype
    models: tuple[str, ...]
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    mixed_prefill: int
    greedy_prompt: int
    greedy_steps: int
    timed_steps: int

    @classmethod
    def for_device(cls, cpu: bool) -> "Plan":
        if cpu:
            return cls("cpu", torch.float32, ("tiny",), (1, 8), (64, 128), 128, 16, 8, 3)
        return cls("cuda:0", torch.bfloat16, ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b"), (1, 8, 32, 64),
                   (512, 2048), 2048, 64, 32, 10)


class Budget:
    """Wall-clock budget: parts that start after it is spent are reported as skipped."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()


def random_model(shape: str, plan: Plan, seed: int = 0) -> Any:
    hidden, intermediate, layers, heads, kv_heads, vocab, tied = QWEN25_SHAPES[shape]
    config = Qwen2Config(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                         tie_word_embeddings=tied, max_position_embeddings=32768, rope_theta=1e6,
                         rms_norm_eps=1e-6)
    torch.manual_seed(seed)
    with torch.device(plan.device):  # initialise on the device: a 7B model in CPU RAM first is slow
        model = AutoModelForCausalLM.from_config(config, dtype=plan.dtype)
    return model.eval()


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def prompt(length: int, vocab: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (length,), generator=generator).tolist()


# --- the torch engine ----------------------------------------------------------------------------

def greedy_vs_generate(engine: TorchEngine, model: Any, plan: Plan) -> dict[str, Any]:
    """Engine greedy tokens vs transformers ``generate`` on the same weights from the same prompt."""
    context = prompt(plan.greedy_prompt, model.config.vocab_size, seed=1)
    engine.add_sequence("greedy")
    tokens, first_logits, feed = [], None, context
    for _ in range(plan.greedy_steps):
        result = engine.step([StepRow("greedy", feed)])
        first_logits = result.logits[0] if first_logits is None else first_logits
        feed = [int(result.sampled[0])]
        tokens.append(feed[0])
    engine.release("greedy")
    config = GenerationConfig(max_new_tokens=plan.greedy_steps, do_sample=False, eos_token_id=[], pad_token_id=0,
                              output_logits=True, return_dict_in_generate=True)
    with transformers_attention(model), torch.no_grad():
        out = model.generate(torch.tensor([context], device=plan.device),
                             attention_mask=torch.ones(1, len(context), dtype=torch.long, device=plan.device),
                             generation_config=config)
    expected = out.sequences[0, len(context):].tolist()
    agree = next((i for i, (a, b) in enumerate(zip(tokens, expected)) if a != b), len(tokens))
    return {"tokens_equal": tokens == expected, "agreeing_prefix": agree, "steps": plan.greedy_steps,
            "first_step_max_abs_logit_diff": float((first_logits - out.logits[0][0].float().cpu()).abs().max())}


def prefill(engine: TorchEngine, ids: list[str], context: int, vocab: int) -> None:
    for index, seq_id in enumerate(ids):
        engine.add_sequence(seq_id)
        engine.step([StepRow(seq_id, prompt(context, vocab, seed=100 + index))])


def timed_decode(engine: TorchEngine, ids: list[str], plan: Plan, last: dict[str, int]) -> float:
    """Median ms per decode step over ``ids`` (two warm-up steps first)."""
    times = []
    for step in range(plan.timed_steps + 2):
        synchronize(plan.device)
        start = time.perf_counter()
        result = engine.step([StepRow(seq_id, [last[seq_id]]) for seq_id in ids])
        synchronize(plan.device)
        if step >= 2:
            times.append((time.perf_counter() - start) * 1e3)
        last.update(zip(ids, result.sampled.tolist()))
    return round(statistics.median(times), 3)


def decode_speed(engine: TorchEngine, plan: Plan, vocab: int, budget: Budget) -> dict[str, Any]:
    """ms/step for each batch size at each context: the largest batch is prefilled once per context."""
    speeds: dict[str, Any] = {}
    for context in plan.contexts:
        ids = [f"c{context}-{i}" for i in range(max(plan.batches))]
        if budget.left() <= 0:
            speeds[f"context_{context}"] = {"skipped": "time budget spent"}
            continue
        prefill(engine, ids, context, vocab)
        last = {seq_id: 0 for seq_id in ids}
        speeds[f"context_{context}"] = {f"batch_{b}_ms_per_step": timed_decode(engine, ids[:b], plan, last)
                                        for b in plan.batches}
        for seq_id in ids:
            engine.release(seq_id)
    return speeds


def mixed_step(engine: TorchEngine, plan: Plan, vocab: int) -> dict[str, Any]:
    """One long prefill next to max_batch - 1 decodes at the longest context: must not run out of memory."""
    decodes = [f"m{i}" for i in range(max(plan.batches) - 1)]
    prefill(engine, decodes, max(plan.contexts), vocab)
    engine.add_sequence("long")
    rows = [StepRow("long", prompt(plan.mixed_prefill, vocab, seed=7))] + [StepRow(s, [1]) for s in decodes]
    if plan.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    synchronize(plan.device)
    start = time.perf_counter()
    engine.step(rows)
    synchronize(plan.device)
    report = {"prefill_tokens": plan.mixed_prefill, "decode_rows": len(decodes),
              "ms": round((time.perf_counter() - start) * 1e3, 3)}
    if plan.device.startswith("cuda"):
        report["peak_extra_gib"] = round((torch.cuda.max_memory_allocated() - before) / 2**30, 3)
    for seq_id in decodes + ["long"]:
        engine.release(seq_id)
    return report


def sdpa_backends(engine: TorchEngine, plan: Plan, vocab: int) -> dict[str, Any]:
    """Which SDPA kernel our masked, batched attention dispatches to, and which backends accept it."""
    engine.add_sequence("sdpa")
    engine.step([StepRow("sdpa", prompt(32, vocab, seed=3))])
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities) as profile:
        engine.step([StepRow("sdpa", [1])])
    dispatched = sorted({event.key for event in profile.key_averages() if "scaled_dot_product" in event.key
                         and event.key != "aten::scaled_dot_product_attention"})
    accepted = {}
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                    SDPBackend.MATH):
        try:
            with sdpa_kernel([backend]):
                engine.step([StepRow("sdpa", [1])])
            accepted[backend.name] = True
        except RuntimeError as error:
            accepted[backend.name] = f"refused: {str(error).splitlines()[0][:160]}"
    engine.release("sdpa")
    return {"dispatched_ops": dispatched, "forced_backend_runs": accepted}


def check_torch_engine(shape: str, plan: Plan, budget: Budget) -> dict[str, Any]:
    model = random_model(shape, plan)
    capacity = max(plan.batches) * (max(plan.contexts) + 64) + plan.mixed_prefill + 1024
    engine = TorchEngine(shape, model, num_blocks=capacity // BLOCK_SIZE, block_size=BLOCK_SIZE)
    vocab = model.config.vocab_size
    report: dict[str, Any] = {"parameters_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
                              "kv_pool_tokens": capacity}
    parts: list[tuple[str, Callable[[], Any]]] = [
        ("greedy_vs_generate", lambda: greedy_vs_generate(engine, model, plan)),
        ("sdpa", lambda: sdpa_backends(engine, plan, vocab)),
        ("mixed_prefill_decode_step", lambda: mixed_step(engine, plan, vocab)),
        ("decode", lambda: decode_speed(engine, plan, vocab, budget)),
    ]
    for name, part in parts:
        report[name] = run_part(part, budget)
    engine.close()
    del engine, model
    free_memory()
    return report


# --- the vLLM engine -----------------------------------------------------------------------------

def check_vllm_engine(plan: Plan, budget: Budget) -> dict[str, Any]:
    """The lead's vLLM step engine on the smallest shape: greedy vs our torch engine, decode speed."""
    try:
        from tokenrouter.engine import vllm_engine  # noqa: F401
        import vllm
    except ImportError as error:
        return {"skipped": f"not importable: {error}"}
    from tokenrouter.config import ModelSpec

    shape = plan.models[0]
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as folder:
        model = random_model(shape, plan)
        model.save_pretrained(folder)
        reference = TorchEngine("reference", model, num_blocks=4096 // BLOCK_SIZE, block_size=BLOCK_SIZE)
        expected = greedy_tokens(reference, plan, model.config.vocab_size)
        reference.close()
        del reference, model
        free_memory()
        spec = ModelSpec(path=folder, engine="vllm", dtype=str(plan.dtype).removeprefix("torch."), device=plan.device,
                         kv_cache_tokens=max(plan.batches) * (max(plan.contexts) + 64),
                         max_batch_size=max(plan.batches), max_prefill_tokens=max(plan.contexts),
                         gpu_memory_utilization=0.5)
        start = time.perf_counter()
        engine = vllm_engine.VLLMEngine.from_spec("vllm", spec)
        report: dict[str, Any] = {"vllm_version": vllm.__version__, "start_s": round(time.perf_counter() - start, 1)}
        vocab = engine.vocab_size
        tokens = run_part(lambda: greedy_tokens(engine, plan, vocab), budget)
        report["greedy_equals_torch_engine"] = tokens == expected if isinstance(tokens, list) else tokens
        report["decode"] = run_part(lambda: decode_speed(engine, plan, vocab, budget), budget)
        engine.close()
    return report


def greedy_tokens(engine: Any, plan: Plan, vocab: int) -> list[int]:
    engine.add_sequence("greedy")
    tokens, feed = [], prompt(plan.greedy_prompt, vocab, seed=1)
    for _ in range(plan.greedy_steps):
        feed = [int(engine.step([StepRow("greedy", feed)]).sampled[0])]
        tokens.append(feed[0])
    engine.release("greedy")
    return tokens


# --- plumbing ------------------------------------------------------------------------------------

def run_part(part: Callable[[], Any], budget: Budget) -> Any:
    """A part's result, or why it did not run / what went wrong (a failing part never ends the check)."""
    if budget.left() <= 0:
        return {"skipped": "time budget spent"}
    try:
        return part()
    except torch.cuda.OutOfMemoryError as error:
        free_memory()
        return {"error": "out of memory", "detail": str(error).splitlines()[0]}
    except Exception as error:  # noqa: BLE001 (the report must carry every failure)
        return {"error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc(limit=3)}


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


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


@contextlib.contextmanager
def timed(report: dict[str, Any]) -> Iterator[None]:
    start = time.perf_counter()
    yield
    report["wall_s"] = round(time.perf_counter() - start, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Our engines on a GPU (or --cpu), as a JSON report.")
    parser.add_argument("--cpu", action="store_true", help="tiny shapes on the CPU (CI)")
    parser.add_argument("--models", help=f"comma-separated subset of {', '.join(QWEN25_SHAPES)}")
    parser.add_argument("--skip-vllm", action="store_true", help="leave the vLLM engine out (reported as skipped)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="stop starting new parts after this (default 420)")
    parser.add_argument("--out", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    plan = Plan.for_device(args.cpu)
    if args.models:
        plan = Plan(**{**plan.__dict__, "models": tuple(args.models.split(","))})
    if not args.cpu and not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible to torch (use --cpu for the CPU miniature)", file=sys.stderr)
        return 2
    budget = Budget(args.budget_s)
    report: dict[str, Any] = {"environment": environment(plan), "torch_engine": {}}
    # stdout carries the report alone: libraries that log to stdout (vLLM) go to stderr meanwhile
    with timed(report), contextlib.redirect_stdout(sys.stderr):
        for shape in plan.models:
            report["torch_engine"][shape] = run_part(lambda: check_torch_engine(shape, plan, budget), budget)
        report["vllm_engine"] = ({"skipped": "--skip-vllm given"} if args.skip_vllm
                                 else run_part(lambda: check_vllm_engine(plan, budget), budget))
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
