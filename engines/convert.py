"""Convert a verified GGUF once into a plain Hugging Face folder (safetensors + tokenizer) that loads fast.

Dequantizing a GGUF takes tens of seconds per start; the converted folder loads in seconds and needs
no `gguf`. The folder is built under a hidden temporary name and renamed into place only after the
marker file, which lists every file with its size and sha256, has been written: a folder with a
valid marker is complete by construction.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from .fetch import disk_errors, sha256_file
from .recipe import InstallError, ModelRecipe, PairRecipe

MARKER = "tokenrouter-model.json"
MARKER_FORMAT = 1


def convert_gguf(gguf: Path, out: Path, recipe: PairRecipe, model: ModelRecipe, progress: bool = True) -> Path:
    """Dequantize `gguf` to `recipe.dtype` and save model, tokenizer and generation config into `out`."""
    partial = out.parent / f".{out.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)  # left over from an interrupted run
    try:
        with disk_errors(partial), tqdm(total=4, unit="step", desc=f"convert {model.name}",
                                        disable=not progress) as bar:
            bar.set_postfix_str("dequantize GGUF")
            lm = load_gguf_model(gguf, recipe.dtype)
            bar.update()
            bar.set_postfix_str("tokenizer")
            tokenizer = load_gguf_tokenizer(gguf)
            lm.generation_config = generation_config(tokenizer, recipe, lm.config.bos_token_id)
            bar.update()
            bar.set_postfix_str("save safetensors")
            lm.save_pretrained(partial)
            tokenizer.save_pretrained(partial)
            del lm  # several GB in fp32: free it before hashing
            make_readable(partial)
            bar.update()
            bar.set_postfix_str("checksum")
            write_marker(partial, recipe, model)
            bar.update()
        if out.exists():
            shutil.rmtree(out)
        os.replace(partial, out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return out


def load_gguf_model(gguf: Path, dtype: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, GgufConfig

    # dequantize=True gives plain dense Linear weights: GGUF-packed modules cannot be saved as safetensors.
    # transformers 5 always builds the model on the meta device first, so peak RAM is about one fp32 copy.
    return AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=getattr(torch, dtype),
        quantization_config=GgufConfig(dequantize=True),
    )


def load_gguf_tokenizer(gguf: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def generation_config(tokenizer: Any, recipe: PairRecipe, bos_token_id: int | None) -> Any:
    """Stop ids from the recipe; sampling settings left at greedy so that a bare generate() is the oracle."""
    from transformers import GenerationConfig

    return GenerationConfig(
        bos_token_id=bos_token_id,
        eos_token_id=[token_id(tokenizer, token) for token in recipe.eos_tokens],
        pad_token_id=token_id(tokenizer, recipe.pad_token),
    )


def token_id(tokenizer: Any, token: str) -> int:
    found = tokenizer.convert_tokens_to_ids(token)
    if found is None or found == tokenizer.unk_token_id:
        raise InstallError(f"the GGUF's tokenizer has no token {token!r}; the recipe's eos/pad tokens do not fit it")
    return int(found)


def make_readable(folder: Path) -> None:
    """safetensors writes its file 0600; the server may run as another user than the one who pulled."""
    for path in folder.rglob("*"):
        if path.is_file():
            path.chmod(path.stat().st_mode | 0o444)


def write_marker(folder: Path, recipe: PairRecipe, model: ModelRecipe) -> dict:
    """Record what the folder was built from and every file's size and digest (written last, on purpose)."""
    import torch
    import transformers

    files = {
        path.relative_to(folder).as_posix(): {"size": path.stat().st_size, "sha256": sha256_file(path)}
        for path in sorted(folder.rglob("*")) if path.is_file() and path.name != MARKER
    }
    info = {
        "format": MARKER_FORMAT,
        "recipe": recipe.name,
        "member": model.member,
        "model": model.name,
        "dtype": recipe.dtype,
        "source": {"sha256": model.sha256, "size": model.size,
                   "packages": [part.requirement for part in model.parts]},
        "converted_with": {"transformers": transformers.__version__, "torch": torch.__version__},
        "files": files,
    }
    (folder / MARKER).write_text(json.dumps(info, indent=2) + "\n")
    return info


def read_marker(folder: Path) -> dict | None:
    try:
        info = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def check_converted(folder: Path, recipe: PairRecipe, model: ModelRecipe, rehash: bool = False) -> list[str]:
    """Problems that make `folder` unusable as this model (empty list: complete and matching the recipe).

    Sizes are always checked; `rehash` also re-computes every sha256 (seconds per GB).
    """
    if not folder.is_dir():
        return ["not installed"]
    info = read_marker(folder)
    if info is None:
        return [f"incomplete: no readable {MARKER}"]
    source = info.get("source") or {}
    if (info.get("format"), source.get("sha256"), info.get("dtype")) != (MARKER_FORMAT, model.sha256, recipe.dtype):
        return [f"built from another source or dtype (marker says sha256 {source.get('sha256')}, "
                f"dtype {info.get('dtype')}); pull with --force"]
    files = info.get("files") or {}
    if not files:
        return ["marker lists no files"]
    return [problem for name, meta in files.items() if (problem := _file_problem(folder / name, meta, rehash))]


def _file_problem(path: Path, meta: dict, rehash: bool) -> str | None:
    if not path.is_file():
        return f"missing {path.name}"
    if path.stat().st_size != meta.get("size"):
        return f"{path.name} has {path.stat().st_size} B, marker says {meta.get('size')}"
    if rehash and sha256_file(path) != meta.get("sha256"):
        return f"{path.name} does not match its recorded sha256"
    return None
