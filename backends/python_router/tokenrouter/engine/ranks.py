"""Where the ranks of a tensor-parallel model run, checked against the hardware at load.

A model with ``tensor_parallel_size`` T runs T ranks. On CPU (vLLM's CPU backend runs TP over
processes) each rank gets an equal share of the model's cores (``cpus``, or every core this process
may use), one at least; on GPU the ranks are T consecutive GPUs starting at the ``device``'s index.
A placement that cannot be honoured is refused before anything starts, naming the field.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from ..config import ModelSpec

NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")  # one entry per GPU the driver sees; reading it starts no CUDA


class RankPlacementError(ValueError):
    """A ``tensor_parallel_size`` this machine cannot honour."""


def cpu_rank_cores(name: str, spec: ModelSpec, available: Sequence[int] | None = None) -> list[list[int]]:
    """The cores of each rank: the model's cores split into ``tensor_parallel_size`` equal groups
    (a remainder is left unused: ranks wait for each other at every layer, so the slowest sets the pace)."""
    cores = list(spec.cpus) if spec.cpus is not None else sorted(os.sched_getaffinity(0) if available is None
                                                                 else available)
    ranks = spec.tensor_parallel_size
    if len(cores) < ranks:
        source = "cpus" if spec.cpus is not None else "the cores this process may use"
        raise RankPlacementError(f"model '{name}': tensor_parallel_size {ranks} needs a CPU core per rank; "
                                 f"{source} give {len(cores)} ({cores})")
    per_rank = len(cores) // ranks
    return [cores[rank * per_rank:(rank + 1) * per_rank] for rank in range(ranks)]


def omp_threads_bind(groups: Sequence[Sequence[int]]) -> str:
    """vLLM's ``VLLM_CPU_OMP_THREADS_BIND``: each rank's cores, ranks separated by ``|``."""
    return "|".join(",".join(str(core) for core in group) for group in groups)


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries (without starting CUDA)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [entry.strip() for entry in listed.split(",") if entry.strip()]
    return [str(i) for i in range(len(list(NVIDIA_GPUS.iterdir())))] if NVIDIA_GPUS.is_dir() else []


def gpu_index(spec: ModelSpec) -> int:
    """The index of the model's (first) GPU: ``cuda:N`` is N, ``cuda`` and ``auto`` are 0."""
    return int(spec.device.partition(":")[2] or 0)


def gpu_rank_devices(name: str, spec: ModelSpec, visible: Sequence[str] | None = None) -> list[str]:
    """The CUDA_VISIBLE_DEVICES entries of the model's ranks: ``tensor_parallel_size`` GPUs from the
    device's index on (``cuda`` is index 0)."""
    visible = visible_gpus() if visible is None else list(visible)
    first = gpu_index(spec)
    ranks = spec.tensor_parallel_size
    if first + ranks > len(visible):
        raise RankPlacementError(f"model '{name}': tensor_parallel_size {ranks} on device {spec.device} needs GPUs "
                                 f"{first} to {first + ranks - 1}; {len(visible)} visible")
    return visible[first:first + ranks]
