"""Load a causal LM for the paged engine: HF safetensors directory or GGUF file, chosen dtype/device.

transformers owns the model definitions and weight loading (including GGUF dequantization); this
module only resolves the spec and checks that the architecture is one the paged attention hook
serves exactly (plain causal attention, no sliding windows).
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from .paged_attention import ATTN_IMPLEMENTATION

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    """``auto`` means CUDA when present, else CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_causal_lm(path: str | Path, dtype: str, device: torch.device) -> PreTrainedModel:
    """The model in eval mode on ``device`` (the engine wires it to the paged attention hook)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"model path {path} does not exist")
    if dtype not in DTYPES:
        raise ValueError(f"dtype '{dtype}' not supported; allowed: {', '.join(DTYPES)}")
    source, extra = (path.parent, {"gguf_file": path.name}) if path.suffix == ".gguf" else (path, {})
    model = AutoModelForCausalLM.from_pretrained(
        source, dtype=DTYPES[dtype], local_files_only=True, **extra
    )
    config = model.config
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model type '{config.model_type}' not supported; allowed: {', '.join(SUPPORTED_MODEL_TYPES)}")
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or []):
        raise ValueError(f"{path}: sliding-window attention layers are not supported by the paged engine")
    return model.to(device).eval()


@contextmanager
def transformers_attention(model: PreTrainedModel, implementation: str = "sdpa") -> Iterator[PreTrainedModel]:
    """Run ``model`` with transformers' own attention inside the block, then give it back to the engine.

    Lets a test or benchmark compare the engine with ``generate`` on the very same weights without a
    second copy in memory (the 1.5B model is 7 GB in fp32). Not for use while the engine steps.
    """
    model.set_attn_implementation(implementation)
    try:
        yield model
    finally:
        model.set_attn_implementation(ATTN_IMPLEMENTATION)


def eos_token_ids_of(*sources: Any) -> frozenset[int]:
    """EOS ids from configs (generation config, model config, or None); each may hold an int, a
    list or nothing."""
    ids: set[int] = set()
    for source in sources:
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    return frozenset(ids)


def generation_config_of(path: str | Path) -> Any:
    """The model directory's generation config, or None when it has none."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(path, local_files_only=True)
    except OSError:
        return None
