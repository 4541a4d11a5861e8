"""How many bytes of text preprocessing reads before it refuses a request as too long, and how
many token ids postprocessing decodes at most (the context limit).

A 20 MB prompt used to be tokenized in full (~50 s, preprocessing grew by 4 GB) only to be told it
was too long. The cap is parameter ``max_input_bytes``, else ``BYTES_PER_TOKEN_BOUND`` times the
context limit (parameter ``max_model_len``, else the model folder's ``max_position_embeddings``):
no prompt that fits the context is that long, since no token of a byte-level BPE vocabulary is
that many bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

BYTES_PER_TOKEN_BOUND = 32
FALLBACK_MAX_MODEL_LEN = 131072  # when neither the repository nor the model folder says


def input_byte_cap(parameters: dict[str, str], tokenizer_path: str) -> int:
    if parameters.get("max_input_bytes"):
        return int(parameters["max_input_bytes"])
    return BYTES_PER_TOKEN_BOUND * context_limit(parameters, tokenizer_path)


def context_limit(parameters: dict[str, str], tokenizer_path: str) -> int:
    """Tokens in the longest context: parameter max_model_len, else the model folder's."""
    return int(parameters.get("max_model_len") or _model_context(Path(tokenizer_path)) or FALLBACK_MAX_MODEL_LEN)


def _model_context(folder: Path) -> int | None:
    config = folder / "config.json"
    if not config.is_file():
        return None
    return json.loads(config.read_text()).get("max_position_embeddings")
