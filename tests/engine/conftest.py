"""Engine fixtures: fresh paged engines on tiny models and transformers references on the same weights."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedModel

from tokenrouter.config import ModelSpec
from tokenrouter.engine.torch_engine import TorchEngine


@pytest.fixture(scope="session", autouse=True)
def _few_threads() -> None:
    # The CI machine has 2 cores shared with other jobs; tiny models gain nothing from more.
    torch.set_num_threads(1)


@pytest.fixture
def make_engine() -> Callable[..., TorchEngine]:
    def make(path: Path, *, block_size: int = 4, kv_cache_tokens: int = 1024, dtype: str = "float32",
             threads: int | None = None) -> TorchEngine:
        spec = ModelSpec(path=str(path), block_size=block_size, kv_cache_tokens=kv_cache_tokens, dtype=dtype,
                         threads=threads)
        return TorchEngine.from_spec(Path(path).name, spec)

    return make


@pytest.fixture(scope="session")
def hf_model() -> Callable[..., PreTrainedModel]:
    """Reference models with transformers' own attention, loaded once per (path, dtype)."""
    cache: dict[tuple[str, str], PreTrainedModel] = {}

    def load(path: Path, dtype: str = "float32") -> PreTrainedModel:
        key = (str(path), dtype)
        if key not in cache:
            cache[key] = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
        return cache[key]

    return load


def greedy_reference(model: PreTrainedModel, context: list[int], steps: int) -> tuple[list[int], torch.Tensor]:
    """transformers ``generate`` from the whole context: greedy tokens and their float32 logits [steps, V].

    No EOS: the engine never stops on its own, so the reference must not either.
    """
    config = GenerationConfig(max_new_tokens=steps, do_sample=False, eos_token_id=[], pad_token_id=0,
                              output_logits=True, return_dict_in_generate=True)
    out = model.generate(torch.tensor([context]), attention_mask=torch.ones(1, len(context), dtype=torch.long),
                         generation_config=config)
    tokens = out.sequences[0, len(context):].tolist()
    assert len(tokens) == steps, "the reference stopped early"
    return tokens, torch.stack([step_logits[0].float() for step_logits in out.logits])


@pytest.fixture(scope="session")
def reference() -> Callable[[PreTrainedModel, list[int], int], tuple[list[int], torch.Tensor]]:
    return greedy_reference
