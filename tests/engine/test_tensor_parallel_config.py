"""``tensor_parallel_size``: refused where an engine or the hardware cannot honour it (the error names
the field), carried through the model repository, and turned into the ranks' placement."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenrouter.config import ConfigError, ModelSpec, load_config
from tokenrouter.engine.ranks import RankPlacementError, cpu_rank_cores, gpu_rank_devices, omp_threads_bind
from tokenrouter.serving.repository import read_repository, render_repository


def _config(large: dict) -> dict:
    return {"models": {"slm": {"engine": "simulated", "profile": "tiny-cpu-small"},
                       "llm": {"engine": "vllm", "path": "m", **large}}}


@pytest.mark.parametrize("large,allowed", [
    ({"engine": "torch"}, "engine 'torch' runs a model on one device; tensor parallelism needs engine vllm or "
                          "tensorrt_llm"),
    ({"engine": "simulated", "profile": "tiny-cpu-large"}, "engine 'simulated'"),
    ({"cpus": [0]}, "tensor_parallel_size 2 on CPU needs a core per rank; cpus gives 1"),
])
def test_an_engine_or_a_placement_that_cannot_split_is_refused(large, allowed):
    with pytest.raises(ConfigError) as caught:
        load_config(_config({**large, "tensor_parallel_size": 2}))
    assert "models.llm" in str(caught.value) and allowed in str(caught.value), str(caught.value)


def test_the_size_itself_is_checked():
    with pytest.raises(ConfigError, match="models.llm.tensor_parallel_size"):
        load_config(_config({"tensor_parallel_size": 0}))
    assert load_config(_config({"tensor_parallel_size": 4, "device": "cuda"})).models["llm"].tensor_parallel_size == 4
    assert load_config(_config({"engine": "tensorrt_llm", "tensor_parallel_size": 2, "device": "cuda"}))


def test_the_repository_carries_it_and_an_edit_is_validated(tmp_path: Path):
    (tmp_path / "m").mkdir()
    config = load_config({**_config({"path": str(tmp_path / "m"), "tensor_parallel_size": 2, "device": "cuda"}),
                          "tokenizer": str(tmp_path / "m")})
    repo = render_repository(config, tmp_path / "repo")
    pbtxt = repo / "llm" / "config.pbtxt"
    assert 'key: "tensor_parallel_size"\n  value {\n    string_value: "2"' in pbtxt.read_text()
    assert read_repository(repo).models["llm"].tensor_parallel_size == 2
    pbtxt.write_text(pbtxt.read_text().replace('string_value: "vllm"', 'string_value: "torch"'))
    with pytest.raises(ConfigError, match="models.llm: tensor_parallel_size 2: engine 'torch'"):
        read_repository(repo)


def test_cpu_ranks_split_the_models_cores():
    spec = ModelSpec(engine="vllm", path="m", tensor_parallel_size=2)
    assert cpu_rank_cores("llm", spec, available=[0, 1]) == [[0], [1]]
    assert cpu_rank_cores("llm", spec, available=[4, 2, 3, 5, 6]) == [[2, 3], [4, 5]]  # a remainder stays unused
    pinned = spec.model_copy(update={"cpus": [6, 7, 8, 9]})
    assert cpu_rank_cores("llm", pinned, available=[0]) == [[6, 7], [8, 9]]  # cpus wins over the affinity
    assert omp_threads_bind([[6, 7], [8, 9]]) == "6,7|8,9"
    with pytest.raises(RankPlacementError, match="model 'llm': tensor_parallel_size 2 needs a CPU core per rank; "
                                                 r"the cores this process may use give 1 \(\[0\]\)"):
        cpu_rank_cores("llm", spec, available=[0])


def test_gpu_ranks_are_consecutive_from_the_device():
    spec = ModelSpec(engine="vllm", path="m", device="cuda:2", tensor_parallel_size=2)
    assert gpu_rank_devices("llm", spec, visible=["0", "1", "2", "3"]) == ["2", "3"]
    assert gpu_rank_devices("llm", spec, visible=["5", "6", "7", "4"]) == ["7", "4"]  # CUDA_VISIBLE_DEVICES order
    with pytest.raises(RankPlacementError, match="size 2 on device cuda:2 needs GPUs 2 to 3; 3 visible"):
        gpu_rank_devices("llm", spec, visible=["0", "1", "2"])
    four = spec.model_copy(update={"device": "cuda", "tensor_parallel_size": 4})
    assert gpu_rank_devices("llm", four, visible=["0", "1", "2", "3"]) == ["0", "1", "2", "3"]


def test_the_vllm_engine_places_its_ranks_before_vllm_starts(monkeypatch):
    from tokenrouter.engine.vllm_engine import engine_arguments, rank_environment

    spec = ModelSpec(engine="vllm", path="m", tensor_parallel_size=2, cpus=[3, 1])
    assert rank_environment("llm", spec, on_cpu=True) == {"VLLM_CPU_OMP_THREADS_BIND": "3|1"}
    assert rank_environment("llm", spec.model_copy(update={"tensor_parallel_size": 1}), on_cpu=True) == {}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    on_gpu = spec.model_copy(update={"device": "cuda:1"})
    assert rank_environment("llm", on_gpu, on_cpu=False) == {"CUDA_VISIBLE_DEVICES": "5,6"}
    # One rank: vLLM takes no device, the process's visible GPUs say where it runs.
    one_rank = on_gpu.model_copy(update={"tensor_parallel_size": 1})
    assert rank_environment("llm", one_rank, on_cpu=False) == {"CUDA_VISIBLE_DEVICES": "5"}
    assert rank_environment("llm", one_rank.model_copy(update={"device": "cuda:2"}), on_cpu=False) == {
        "CUDA_VISIBLE_DEVICES": "6"}
    for first in ("cuda", "cuda:0"):  # the first visible GPU is vLLM's own choice: nothing to narrow
        assert rank_environment("llm", one_rank.model_copy(update={"device": first}), on_cpu=False) == {}
    with pytest.raises(RankPlacementError, match="on device cuda:3 needs GPUs 3 to 3; 3 visible"):
        rank_environment("llm", one_rank.model_copy(update={"device": "cuda:3"}), on_cpu=False)
    arguments = engine_arguments(spec, dtype="float32", on_cpu=True, max_position_embeddings=4096)
    assert (arguments["tensor_parallel_size"], arguments["distributed_executor_backend"]) == (2, "mp")
    assert arguments["worker_extension_cls"] == "tokenrouter.engine.vllm_capture.CaptureExtension"
    one = engine_arguments(spec.model_copy(update={"tensor_parallel_size": 1}), dtype="float32", on_cpu=True,
                           max_position_embeddings=4096)
    assert (one["tensor_parallel_size"], one["distributed_executor_backend"]) == (1, "uni")
