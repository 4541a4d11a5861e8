"""``dtype: auto``: which dtype each engine computes in, from the CPU's flags and the device."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenrouter.config import ModelSpec
from tokenrouter.engine.dtypes import cpu_flags, resolve_dtype

AMX = frozenset({"fpu", "avx512f", "amx_bf16", "amx_tile"})
AVX512_BF16 = frozenset({"avx512f", "avx512_bf16"})
PLAIN = frozenset({"fpu", "avx2", "avx512f"})


def spec(engine: str, dtype: str = "auto") -> ModelSpec:
    profile = {"simulated": {"profile": "tiny-cpu-small"}}.get(engine, {})
    return ModelSpec(engine=engine, dtype=dtype, path=None if engine == "simulated" else "/m", **profile)


@pytest.mark.parametrize("flags,expected", [(AMX, "bfloat16"), (AVX512_BF16, "bfloat16"), (PLAIN, "float32"),
                                            (frozenset(), "float32")])
def test_vllm_on_cpu_runs_bfloat16_only_where_the_cpu_has_bfloat16_units(flags, expected):
    assert resolve_dtype(spec("vllm"), on_gpu=False, flags=flags) == expected


@pytest.mark.parametrize("engine", ["torch", "simulated"])
def test_the_torch_oracle_and_the_simulator_stay_float32_on_a_bfloat16_cpu(engine):
    assert resolve_dtype(spec(engine), on_gpu=False, flags=AMX) == "float32"


def test_gpu_engines_take_the_checkpoint_dtype():
    assert resolve_dtype(spec("vllm"), on_gpu=True, flags=PLAIN) == "auto"
    assert resolve_dtype(spec("tensorrt_llm"), on_gpu=True, flags=PLAIN) == "auto"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_an_explicit_dtype_always_wins(dtype):
    assert resolve_dtype(spec("vllm", dtype), on_gpu=False, flags=AMX) == dtype
    assert resolve_dtype(spec("vllm", dtype), on_gpu=False, flags=PLAIN) == dtype
    assert resolve_dtype(spec("torch", dtype), on_gpu=False, flags=AMX) == dtype


def test_auto_is_the_default():
    assert ModelSpec(engine="vllm", path="/m").dtype == "auto"


def test_flags_are_read_from_cpuinfo(tmp_path: Path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Xeon\nflags\t\t: fpu avx512_bf16 amx_bf16\n\n"
                       "processor\t: 1\nflags\t\t: fpu\n")
    assert cpu_flags(cpuinfo) == {"fpu", "avx512_bf16", "amx_bf16"}
    assert cpu_flags(tmp_path / "missing") == frozenset()
