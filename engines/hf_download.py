"""`tokenrouter models download`: the official bf16 Hugging Face checkpoints of the default pair, for GPU.

The CPU setup converts community GGUFs to fp32 (`models pull`); a GPU serves the official
safetensors as Qwen publishes them. huggingface_hub (a dependency of transformers and vLLM, so
present in the NGC vLLM image) downloads them with its own progress bars and resumes a broken
download where it stopped; a second run finds the files in place and only checks them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .recipe import InstallError

# the pair's member -> Hugging Face repository; the folder under <models dir>/hf/ is the repository's name.
OFFICIAL_CHECKPOINTS = {
    "small": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
    "large": "Qwen/Qwen2.5-Coder-1.5B-Instruct",
}
HF_DIR = "hf"
# What a served model needs: weights, configs, tokenizer. Skips README/LICENSE images and other formats.
ALLOW_PATTERNS = ["*.json", "*.safetensors", "merges.txt", "vocab.json", "tokenizer*", "LICENSE"]


def checkpoint_dir(dest: Path, member: str) -> Path:
    """Where the checkpoint of the pair's ``member`` (small, large) lives (or will) under the models dir."""
    return Path(dest) / HF_DIR / OFFICIAL_CHECKPOINTS[member].split("/")[1]


def download_official(dest: Path, members: Sequence[str] | None = None, *, revision: str | None = None,
                      progress: bool = True) -> dict[str, Path]:
    """Download (or complete) each member's official checkpoint into ``dest``/hf/<name>; returns the folders."""
    import os

    if not progress:
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # read by huggingface_hub at import
    from huggingface_hub import snapshot_download

    members = list(members) if members else list(OFFICIAL_CHECKPOINTS)
    unknown = sorted(set(members) - set(OFFICIAL_CHECKPOINTS))
    if unknown:
        raise InstallError(f"unknown model(s) {unknown} of the pair; allowed: {', '.join(OFFICIAL_CHECKPOINTS)}")
    folders = {}
    for member in members:
        folder = checkpoint_dir(dest, member)
        snapshot_download(OFFICIAL_CHECKPOINTS[member], revision=revision, local_dir=folder,
                          allow_patterns=ALLOW_PATTERNS)
        folders[member] = folder
    return folders
