"""Build the engine a model spec asks for: one name -> factory table.

Engine modules are imported only when used, so a CPU machine never imports GPU-only code and the
simulated engine needs no model files. A vLLM engine must own its process (vLLM keeps a
process-global forward context and thread binding): unless the caller says it owns the whole
process (a Triton stub serves one model), it runs in a child process behind ``EngineProcess``.
"""

from __future__ import annotations

from typing import Callable

from ..config import ENGINE_KINDS, ModelSpec
from .base import Engine


def _torch(name: str, spec: ModelSpec) -> Engine:
    from .torch_engine import TorchEngine

    return TorchEngine.from_spec(name, spec)


def _simulated(name: str, spec: ModelSpec) -> Engine:
    from .simulated import SimulatedEngine

    return SimulatedEngine.from_spec(name, spec)


def _tensorrt_llm(name: str, spec: ModelSpec) -> Engine:
    from .tensorrt_llm import TensorRTLLMEngine

    return TensorRTLLMEngine.from_spec(name, spec)


def _vllm(name: str, spec: ModelSpec) -> Engine:
    from .vllm_engine import VLLMEngine

    return VLLMEngine.from_spec(name, spec)


ENGINE_FACTORIES: dict[str, Callable[[str, ModelSpec], Engine]] = {
    "vllm": _vllm,
    "torch": _torch,
    "simulated": _simulated,
    "tensorrt_llm": _tensorrt_llm,
}
# Engines that must be alone in their process.
PROCESS_EXCLUSIVE = frozenset({"vllm"})
assert set(ENGINE_FACTORIES) == set(ENGINE_KINDS), "config.ENGINE_KINDS and the factory table disagree"


def create_engine(name: str, spec: ModelSpec, *, owns_process: bool = False) -> Engine:
    """The engine for ``spec``. ``owns_process``: the caller runs no other engine in this process
    (then a process-exclusive engine runs here instead of in a child process)."""
    factory = ENGINE_FACTORIES.get(spec.engine)
    if factory is None:
        raise ValueError(f"unknown engine '{spec.engine}'; allowed: {', '.join(ENGINE_FACTORIES)}")
    if spec.engine in PROCESS_EXCLUSIVE and not owns_process:
        from .process_engine import EngineProcess

        return EngineProcess(name, spec)
    if spec.cpus is not None and owns_process:
        pin_process(spec.cpus)
    return factory(name, spec)


def pin_process(cpus: list[int]) -> None:
    """Pin this process to ``cpus`` (Linux): engines sharing a machine stop fighting over cores."""
    import os

    os.sched_setaffinity(0, cpus)
