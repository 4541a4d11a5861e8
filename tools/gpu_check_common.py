"""What every part of the device check (tools/gpu_check.py) shares: the plan, the time budget, parts
that report instead of raising, and models built on the spot (no download).

Needs torch, transformers and tokenizers only: no pydantic, no vLLM, no Triton.
"""

from __future__ import annotations

import gc
import statistics
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch

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
    """What to run. The exact checks use a tiny model pair with peaked distributions in float32 (so a
    token mismatch is a bug, not a rounding tie); the speed parts use real shapes with random weights."""

    device: str
    dtype: torch.dtype  # of the speed parts
    models: tuple[str, ...]  # shapes of the torch engine's speed parts
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    mixed_prefill: int
    greedy_prompt: int
    greedy_steps: int
    timed_steps: int
    family: str  # tiny pair of the exact checks (engines/tiny.py)
    exact_prompts: int  # routed requests compared with the reference
    exact_tokens: int
    bench_pair: tuple[str, str] | None  # shapes (small, large) of the benchmark; None: the tiny pair
    bench_clients: tuple[int, ...]  # N concurrent requests (and vLLM batch sizes)
    bench_tokens: int
    bench_reps: int
    route_rate: float  # share of positions the exact routed check defers to the large model (2 tokens each)
    bench_rate: float  # the benchmark's: about the large model's token share (one token each)

    @classmethod
    def for_device(cls, cpu: bool) -> "Plan":
        if cpu:
            return cls("cpu", torch.float32, ("tiny",), (1, 8), (64, 128), 128, 16, 8, 3, "qwen2", 6, 12, None,
                       (2, 4), 8, 1, 0.2, 0.1)
        return cls("cuda:0", torch.bfloat16, ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b"), (1, 8, 32, 64),
                   (512, 2048), 2048, 64, 32, 10, "qwen2", 16, 24, ("qwen2.5-0.5b", "qwen2.5-1.5b"), (8, 32), 64, 2,
                   0.2, 0.1)

    def with_models(self, models: tuple[str, ...]) -> "Plan":
        return replace(self, models=models)


class Budget:
    """Wall-clock budget: parts that start after it is spent are reported as skipped."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()


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
        return {"error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc(limit=4)}


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str) -> tuple[Any, float]:
    """(result, seconds), the device's queue drained before and after."""
    synchronize(device)
    start = time.perf_counter()
    result = fn()
    synchronize(device)
    return result, time.perf_counter() - start


def median(values: list[float]) -> float:
    return round(statistics.median(values), 4)


def prompt(length: int, vocab: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (length,), generator=generator).tolist()  # past the tiny pair's specials


def mixed_prompts(count: int, vocab: int, seed: int, shortest: int = 5, longest: int = 60) -> list[list[int]]:
    """``count`` prompts of lengths spread over [shortest, longest]."""
    step = max(1, (longest - shortest) // max(1, count - 1))
    return [prompt(shortest + (i * step) % (longest - shortest + 1), vocab, seed + i) for i in range(count)]


def shape_config(shape: str) -> Any:
    from transformers import Qwen2Config

    hidden, intermediate, layers, heads, kv_heads, vocab, tied = QWEN25_SHAPES[shape]
    return Qwen2Config(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                       tie_word_embeddings=tied, max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6)


def random_model(shape: str, device: str, dtype: torch.dtype, seed: int = 0) -> Any:
    """A Qwen2.5-shaped model with random weights, initialised on the device (a 7B in CPU RAM first is slow)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(shape_config(shape), dtype=dtype)
    return model.eval()


def tiny_pair(family: str) -> dict[str, Path]:
    """The tiny small/large pair of the exact checks, built once (about a second) into engines/build/tiny."""
    from tokenrouter_engines.tiny import ensure_tiny_pair

    return ensure_tiny_pair(family)


def load_model(path: Path, device: str, dtype: torch.dtype = torch.float32) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()


def skipped(reason: str) -> dict[str, str]:
    return {"skipped": reason}
