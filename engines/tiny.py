"""Tiny random model pairs (small + large, one tokenizer) for tests, deterministic from a seed.

Each pair is two complete HF model directories that ``AutoModelForCausalLM`` and ``AutoTokenizer``
load offline. The tokenizer is a byte-level BPE trained on the local Python standard library, so it
sees real code and builds in about a second. Weights are drawn from one seeded generator with scales
chosen so that next-token distributions are peaked (greedy argmax has wide margins, oracle tests are
not decided by rounding) while attention still moves the residual stream (outputs depend on context,
so KV bugs show up as wrong tokens).
"""

from __future__ import annotations

import math
import os
import shutil
import sysconfig
import tempfile
from pathlib import Path
from typing import Iterator

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
)

FAMILIES = ("qwen2", "qwen3", "llama")
VOCAB_SIZE = 4096
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Bump when anything below changes what a build produces; ensure_tiny_pair rebuilds on mismatch.
RECIPE_VERSION = "tiny-v2"
MARKER = "COMPLETE"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Shapes per size. "large" is about 4.5x the small model's FLOPs per token and 3x its layers.
# head_dim 32 = hidden_size / num_attention_heads: vLLM's CPU attention refuses head_dim 16, and some
# of vLLM's model definitions derive head_dim from hidden_size / heads instead of reading it.
SIZES: dict[str, dict[str, int]] = {
    "small": dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=32),
    "large": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=6, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32),
}
_CONFIGS: dict[str, type[PretrainedConfig]] = {"qwen2": Qwen2Config, "qwen3": Qwen3Config, "llama": LlamaConfig}

# Init scales (std multipliers of 1/sqrt(fan_in)); see the module docstring for why they are large.
EMBED_STD = 1.0
PROJ_GAIN = 1.0
LM_HEAD_GAIN = 6.0
BIAS_STD = 0.1


def default_root() -> Path:
    return Path(__file__).resolve().parent / "build" / "tiny"


def _corpus() -> Iterator[str]:
    """The top-level modules of the local standard library, in sorted order (fixed input order)."""
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        yield path.read_text(encoding="utf-8", errors="replace")


def train_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE with ChatML specials; the same corpus gives the same vocabulary every time."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
    )


def _config(family: str, size: str, tokenizer: PreTrainedTokenizerFast) -> PretrainedConfig:
    eos = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    return _CONFIGS[family](
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
        **SIZES[size],
    )


@torch.no_grad()
def _init_weights(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Overwrite every parameter from ``generator`` in name order, so bytes depend on the seed only."""
    for name, param in sorted(model.named_parameters()):
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        elif "embed_tokens" in name:
            param.normal_(0.0, EMBED_STD, generator=generator)
        elif name.endswith(".bias"):
            param.normal_(0.0, BIAS_STD, generator=generator)
        else:
            gain = LM_HEAD_GAIN if name.startswith("lm_head") else PROJ_GAIN
            param.normal_(0.0, gain / math.sqrt(param.shape[1]), generator=generator)


def _save_model(out_dir: Path, family: str, size: str, seed: int, tokenizer: PreTrainedTokenizerFast) -> None:
    config = _config(family, size, tokenizer)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # One generator per (seed, family, size): the small model never shifts the large model's draws.
    generator = torch.Generator().manual_seed(seed * 1000 + FAMILIES.index(family) * 10 + list(SIZES).index(size))
    _init_weights(model, generator)
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, do_sample=False
    )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def make_tiny_pair(out_dir: Path, family: str = "qwen3", seed: int = 0) -> dict[str, Path]:
    """Write ``out_dir/small`` and ``out_dir/large`` (complete HF dirs) and return their paths."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family '{family}'; allowed: {', '.join(FAMILIES)}")
    out_dir = Path(out_dir)
    tokenizer = train_tokenizer()
    paths = {}
    for size in SIZES:
        paths[size] = out_dir / size
        _save_model(paths[size], family, size, seed, tokenizer)
    return paths


def ensure_tiny_pair(family: str = "qwen3", seed: int = 0, root: Path | None = None) -> dict[str, Path]:
    """Build the pair once under ``root/<family>-seed<seed>/`` and reuse it afterwards.

    The build happens in a temporary sibling directory that is renamed into place only when
    complete (marker included), so parallel test processes see either nothing or a whole pair.
    """
    root = Path(root) if root is not None else default_root()
    final = root / f"{family}-seed{seed}"
    paths = {size: final / size for size in SIZES}
    if _is_complete(final):
        return paths
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
    try:
        make_tiny_pair(tmp, family, seed)
        (tmp / MARKER).write_text(RECIPE_VERSION)
        if final.exists() and not _is_complete(final):
            shutil.rmtree(final, ignore_errors=True)  # stale recipe or a crashed pre-marker layout
        try:
            os.rename(tmp, final)
        except OSError:
            if not _is_complete(final):  # someone else won the race with a complete pair: fine
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return paths


def _is_complete(pair_dir: Path) -> bool:
    marker = pair_dir / MARKER
    return marker.is_file() and marker.read_text() == RECIPE_VERSION

