"""Tiny model pairs: complete offline HF folders, one tokenizer, byte-identical from a seed, safe to build in
parallel."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
from pathlib import Path

from transformers import AutoTokenizer

from tokenrouter_engines.tiny import MARKER, ensure_tiny_pair, make_tiny_pair


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_seed_same_bytes_and_one_tokenizer(tmp_path):
    first = make_tiny_pair(tmp_path / "a", "llama", seed=3)
    again = make_tiny_pair(tmp_path / "b", "llama", seed=3)
    other = make_tiny_pair(tmp_path / "c", "llama", seed=4)
    for size in ("small", "large"):
        for name in ("model.safetensors", "tokenizer.json", "config.json"):
            assert digest(first[size] / name) == digest(again[size] / name), f"{size}/{name}"
        assert digest(first[size] / "model.safetensors") != digest(other[size] / "model.safetensors")
    assert digest(first["small"] / "tokenizer.json") == digest(first["large"] / "tokenizer.json")


def test_tokenizer_and_sizes(tiny_pair_family):
    family, paths = tiny_pair_family
    tokenizer = AutoTokenizer.from_pretrained(paths["small"])
    assert tokenizer.decode(tokenizer("def f(x):\n    return x").input_ids) == "def f(x):\n    return x"
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    configs = {size: json.loads((path / "config.json").read_text()) for size, path in paths.items()}
    generation = json.loads((paths["small"] / "generation_config.json").read_text())
    eos = {tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
    assert set(generation["eos_token_id"]) == eos and configs["small"]["model_type"] == family
    assert configs["large"]["num_hidden_layers"] > configs["small"]["num_hidden_layers"]
    assert configs["large"]["hidden_size"] > configs["small"]["hidden_size"]


def _ensure(root: str) -> dict[str, str]:
    return {size: str(path) for size, path in ensure_tiny_pair("qwen2", 5, Path(root)).items()}


def test_parallel_builds_see_a_whole_pair(tmp_path):
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        results = pool.map(_ensure, [str(tmp_path)] * 2)
    assert results[0] == results[1]
    pair_dir = Path(results[0]["small"]).parent
    assert (pair_dir / MARKER).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [pair_dir.name]  # no temporary folder left behind
