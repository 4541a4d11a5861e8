"""The real Qwen2.5-Coder pair, offline: the paged engine continues a code prompt exactly as
transformers ``generate`` does, from the converted safetensors folders and from the original GGUF.

Slow (minutes on 2 cores, up to 7 GB of RAM at a time); skipped unless the pair is installed
(`tokenrouter models pull`). Run: pytest -m slow tests/engine/test_real_pair.py
"""

from __future__ import annotations

import gc

import pytest
import torch
from transformers import AutoTokenizer

from tokenrouter.config import ModelSpec
from tokenrouter.engine.base import StepRow
from tokenrouter.engine.loader import transformers_attention
from tokenrouter.engine.torch_engine import TorchEngine
from tokenrouter_engines.convert import read_marker
from tokenrouter_engines.models import GGUF_DIR, model_dirs
from tokenrouter_engines.recipe import load_recipe

pytestmark = pytest.mark.slow

PROMPTS = [
    "def fibonacci(n):\n",
    'import json\n\n\ndef load_config(path):\n    """Read a JSON config file and return it as a dict."""\n',
]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def real_pair() -> dict:
    dirs = model_dirs()
    if any(read_marker(path) is None for path in dirs.values()):
        pytest.skip("the real pair is not installed; run `tokenrouter models pull`")
    return dirs


def engine_greedy(engine: TorchEngine, prompts: list[list[int]]) -> list[list[int]]:
    """Both prompts in one batch (mixed lengths), greedy, NEW_TOKENS each."""
    for i in range(len(prompts)):
        engine.add_sequence(i)
    outputs: list[list[int]] = [[] for _ in prompts]
    feeds = dict(enumerate(prompts))
    for _ in range(NEW_TOKENS):
        result = engine.step([StepRow(i, tokens) for i, tokens in feeds.items()])
        for i, token in zip(result.seq_ids, result.sampled.tolist()):
            outputs[i].append(token)
            feeds[i] = [token]
    return outputs


def generate_greedy(engine: TorchEngine, prompt: list[int]) -> list[int]:
    """transformers ``generate`` (its own attention and cache) on the engine's weights, batch 1."""
    with transformers_attention(engine.model) as model, torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=[], pad_token_id=0)
    return out[0, len(prompt):].tolist()


def load(path) -> TorchEngine:
    return TorchEngine.from_spec("real", ModelSpec(path=str(path), threads=2, kv_cache_tokens=2048))


@pytest.mark.parametrize("member", ["small", "large"])
def test_greedy_code_continuation_equals_generate(real_pair, member):
    tokenizer = AutoTokenizer.from_pretrained(real_pair[member])
    prompts = [tokenizer(text).input_ids for text in PROMPTS]
    engine = load(real_pair[member])
    ours = engine_greedy(engine, prompts)
    for prompt, tokens in zip(prompts, ours):
        assert tokens == generate_greedy(engine, prompt), tokenizer.decode(tokens)
    assert "return" in tokenizer.decode(ours[0])  # a sensible body, not just equal noise
    engine.close()
    gc.collect()


def test_gguf_loads_and_matches_converted_weights(real_pair):
    """The engine reads the original GGUF (transformers dequantizes it) and decodes like the converted folder."""
    small = load_recipe().models["small"]
    gguf = real_pair["small"].parent / GGUF_DIR / small.gguf_filename
    if not gguf.is_file():
        pytest.skip(f"{gguf} is not kept")
    tokenizer = AutoTokenizer.from_pretrained(real_pair["small"])
    prompts = [tokenizer(text).input_ids for text in PROMPTS]
    from_gguf = load(gguf)
    assert from_gguf.vocab_size == 151936 and from_gguf.eos_token_ids
    ours = engine_greedy(from_gguf, prompts)
    from_gguf.close()
    gc.collect()
    converted = load(real_pair["small"])
    assert ours == engine_greedy(converted, prompts)
