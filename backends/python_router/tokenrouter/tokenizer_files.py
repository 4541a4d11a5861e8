"""A model folder's tokenizer read with the ``tokenizers`` library and jinja2 alone (no transformers,
no torch: importing transformers' AutoTokenizer costs 4-5 CPU s, and every Triton stub that handles
text loads one).

It reads what transformers reads for a tokenizer.json folder and applies it the same way:
``tokenizer.json`` (vocabulary, pre-tokenizer, decoder, post-processor, added tokens), the named
special tokens of ``special_tokens_map.json`` and ``tokenizer_config.json`` (the latter wins; named
and extra specials missing from the added tokens are added as special tokens), and the chat template
(``chat_template.jinja``, else tokenizer_config's ``chat_template``; of several named ones, ``default``).
tests/test_text_codec.py holds every method equal to transformers' AutoTokenizer on the folders the tests build.

Two things transformers 5 does that follow from the file: tokenizer_config's ``add_bos_token`` /
``add_eos_token`` change nothing for a tokenizer.json with a post-processor (it alone adds specials on
encoding), and a tokenizer whose model-specific class rebuilds the pipeline from the vocabulary (e.g.
Qwen2Tokenizer) reads a real checkpoint's tokenizer.json the same way. Not the same: a folder whose
tokenizer.json is not what its class would build (the tiny qwen2 pair's generic byte-level BPE, which
transformers re-reads with Qwen2's pre-tokenizer); the codec encodes it as the file says.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from tokenizers import AddedToken, Tokenizer

from .chat_template import render_chat

TOKENIZER_FILE = "tokenizer.json"
NAMED_SPECIALS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
EXTRA_SPECIALS = ("additional_special_tokens", "extra_special_tokens")


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _token_text(value: Any) -> str | None:
    """A special token as written in a config: a string, or an AddedToken's dict (its ``content``)."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _chat_template(folder: Path, config: dict[str, Any]) -> str | None:
    path = folder / "chat_template.jinja"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        named = {entry["name"]: entry["template"] for entry in template}
        if "default" not in named:
            raise ValueError(f"{folder}: several chat templates ({sorted(named)}) and none named 'default'")
        template = named["default"]
    return template if isinstance(template, str) else None


class FileTokenizer:
    """The tokenizer of an HF model folder that has a tokenizer.json."""

    def __init__(self, folder: str | Path) -> None:
        folder = Path(folder)
        self._backend = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
        config = {**_read_json(folder / "special_tokens_map.json"), **_read_json(folder / "tokenizer_config.json")}
        self.special_tokens = {name: text for name in NAMED_SPECIALS
                               if (text := _token_text(config.get(name))) is not None}
        extras = [text for key in EXTRA_SPECIALS for value in (config.get(key) or []) if (text := _token_text(value))]
        self._add_missing_specials([*self.special_tokens.values(), *extras])
        self.chat_template = _chat_template(folder, config)
        self.eos_token_id, self.pad_token_id, self.unk_token_id = (
            self._special_id(name) for name in ("eos_token", "pad_token", "unk_token"))

    def _add_missing_specials(self, tokens: list[str]) -> None:
        added = {token.content for token in self._backend.get_added_tokens_decoder().values()}
        missing = list(dict.fromkeys(token for token in tokens if token not in added))
        if missing:
            self._backend.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in missing])

    def __len__(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    def _special_id(self, name: str) -> int | None:
        text = self.special_tokens.get(name)
        return None if text is None else self._backend.token_to_id(text)

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        # encode_batch lets go of the GIL while it works (encode holds it: a 1 MB prompt stalled other threads
        # for seconds); a worker thread counting a big prompt leaves the event loop running
        return self._backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, ids: Sequence[int]) -> str:
        """Special tokens skipped, spaces as decoded (transformers' clean_up_tokenization_spaces=False)."""
        return self._backend.decode(list(ids), skip_special_tokens=True)

    def render_chat(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template")
        return render_chat(self.chat_template, messages, self.special_tokens,
                           add_generation_prompt=add_generation_prompt)
