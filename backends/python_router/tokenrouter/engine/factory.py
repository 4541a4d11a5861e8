"""Build the engine a model spec asks for. Engine modules are imported only when used, so a CPU
machine never imports GPU-only code and the simulated engine needs no model files."""

from __future__ import annotations

from ..config import ModelSpec
from .base import Engine


def create_engine(name: str, spec: ModelSpec) -> Engine:
    if spec.engine == "torch":
        from .torch_engine import TorchEngine

        return TorchEngine.from_spec(name, spec)
    if spec.engine == "simulated":
        from .simulated import SimulatedEngine

        return SimulatedEngine.from_spec(name, spec)
    if spec.engine == "tensorrt_llm":
        from .tensorrt_llm import TensorRTLLMEngine

        return TensorRTLLMEngine.from_spec(name, spec)
    raise ValueError(f"unknown engine '{spec.engine}'; allowed: torch, simulated, tensorrt_llm")
