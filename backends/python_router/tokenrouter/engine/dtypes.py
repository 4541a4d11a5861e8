"""The dtype an engine computes in: ``dtype: auto`` resolved per engine kind and device.

vLLM on a CPU with bfloat16 matrix units (AMX, AVX-512 BF16) runs bfloat16: on this project's Xeon
it decodes 2.3x and prefills 2.6x faster than float32 with the same greedy text (docs/engine.md).
Our torch engine keeps float32: it is the exact oracle the tests compare every engine against.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the torch engine imports this module and needs no pydantic (tools/gpu_check.py)
    from ..config import ModelSpec

# /proc/cpuinfo flags of the x86 units that make bfloat16 matmuls fast on a CPU.
BF16_CPU_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first CPU's feature flags (empty where there is no /proc/cpuinfo)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def cpu_has_fast_bf16(flags: frozenset[str] | None = None) -> bool:
    return bool(BF16_CPU_FLAGS & (cpu_flags() if flags is None else flags))


def resolve_dtype(spec: "ModelSpec", *, on_gpu: bool, flags: frozenset[str] | None = None) -> str:
    """The dtype ``spec`` runs in. An explicit dtype always wins; ``auto`` is float32 for the torch
    and simulated engines, "auto" for GPU engines (vLLM and TensorRT-LLM then take the checkpoint's
    dtype, falling back where the GPU lacks bfloat16), and on CPU bfloat16 where the CPU has it."""
    if spec.dtype != "auto":
        return spec.dtype
    if spec.engine in ("torch", "simulated"):
        return "float32"
    if on_gpu:
        return "auto"
    return "bfloat16" if cpu_has_fast_bf16(flags) else "float32"
