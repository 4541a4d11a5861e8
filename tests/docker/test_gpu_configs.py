"""The GPU configs say what they run: vLLM engines, bf16, the CPU default's policy, GPU instance groups."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from tokenrouter.config import load_config

ROOT = Path(__file__).resolve().parents[2]
GPU_CONFIGS = sorted((ROOT / "configs").glob("*gpu*.yaml"))
# The official checkpoints' shapes (config.json of Qwen2.5(-Coder)-0.5B/1.5B/32B/72B-Instruct): layers, KV
# heads, head dim, parameters. Used to check that each engine's share of its GPU holds weights + KV.
SHAPES = {"0.5B": (24, 2, 64, 0.49e9), "1.5B": (28, 2, 128, 1.54e9), "32B": (64, 8, 128, 32.76e9),
          "72B": (80, 8, 128, 72.71e9)}
SMALLEST_GPU_BYTES = 24e9  # docs/deploy.md: the one-GPU config needs a 24 GB GPU
TENSOR_PARALLEL_GPU_BYTES = 80e9  # the tensor-parallel configs are for 80 GB GPUs (their headers say so)


@pytest.fixture(params=GPU_CONFIGS, ids=lambda p: p.name)
def config_path(request) -> Path:
    return request.param


def test_there_are_one_and_two_gpu_configs() -> None:
    assert [p.name for p in GPU_CONFIGS] == ["qwen2.5-32b-tp2-gpu.yaml", "qwen2.5-72b-tp4-gpu.yaml",
                                            "qwen2.5-coder-2gpu.yaml", "qwen2.5-coder-gpu-two-nodes.yaml",
                                            "qwen2.5-coder-gpu.yaml"]


def test_gpu_configs_run_vllm_in_bf16_with_the_cpu_defaults_policy(config_path: Path) -> None:
    config, default = load_config(config_path), load_config(ROOT / "configs" / "qwen2.5-coder.yaml")
    for spec in config.models.values():
        assert (spec.engine, spec.dtype) == ("vllm", "bfloat16")
        assert spec.device.startswith("cuda:")
    assert config.policy == default.policy
    assert (config.entry, config.chat_template) == (default.entry, default.chat_template)


def test_engines_sharing_a_gpu_fit_their_memory_shares(config_path: Path) -> None:
    """Per GPU: a tensor-parallel model takes its share of each of its GPUs (tensor_parallel_size
    consecutive GPUs from its device's index) and holds 1/T of its weights and of its KV heads on each."""
    config = load_config(config_path)
    gpu_bytes = SMALLEST_GPU_BYTES
    if any(spec.tensor_parallel_size > 1 for spec in config.models.values()):
        gpu_bytes = TENSOR_PARALLEL_GPU_BYTES
    shares: dict[str, float] = defaultdict(float)
    for spec in config.models.values():
        ranks = spec.tensor_parallel_size
        first = int(spec.device.partition(":")[2])
        for gpu in range(first, first + ranks):
            shares[f"{spec.server} cuda:{gpu}"] += spec.gpu_memory_utilization  # a GPU of one server
        layers, kv_heads, head_dim, params = next(shape for size, shape in SHAPES.items()
                                                  if f"-{size}-" in Path(spec.path).name)
        assert kv_heads % ranks == 0, "vLLM splits the KV heads evenly over the ranks"
        kv_bytes = spec.kv_cache_tokens * layers * 2 * (kv_heads // ranks) * head_dim * 2  # K and V, bf16
        # weights + KV must leave a quarter of the share for activations and CUDA graphs
        assert params * 2 / ranks + kv_bytes <= 0.75 * spec.gpu_memory_utilization * gpu_bytes, spec.path
    assert all(total <= 0.9 for total in shares.values()), dict(shares)


def test_each_engine_process_sees_the_gpus_its_device_names(config_path: Path, monkeypatch) -> None:
    """What the memory arithmetic above counts is where vLLM runs: each model's engine process sees
    (CUDA_VISIBLE_DEVICES) the tensor_parallel_size GPUs from its device's index on, or, when the
    engine narrows nothing, the first visible one; and a server's models share no GPU unless the
    config puts them on one (the 2-GPU pair: cuda:0 and cuda:1)."""
    from tokenrouter.engine.vllm_engine import rank_environment

    visible = [str(gpu) for gpu in range(8)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(visible))
    config = load_config(config_path)
    for name, spec in config.models.items():
        sees = rank_environment(name, spec, on_cpu=False).get("CUDA_VISIBLE_DEVICES", visible[0]).split(",")
        first = int(spec.device.partition(":")[2])
        assert sees == visible[first:first + spec.tensor_parallel_size], (name, spec.device)
    if config_path.name == "qwen2.5-coder-2gpu.yaml":
        assert [rank_environment(n, s, on_cpu=False) for n, s in config.models.items()] == [
            {}, {"CUDA_VISIBLE_DEVICES": "1"}]


def test_a_request_of_the_configs_full_length_fits_every_pool(config_path: Path) -> None:
    """The vLLM engine caps a sequence at its KV pool: the config's max_model_len must fit each one."""
    config = load_config(config_path)
    for spec in config.models.values():
        assert config.max_model_len <= spec.kv_cache_tokens
