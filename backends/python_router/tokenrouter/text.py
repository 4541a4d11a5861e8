"""Text <-> token ids for clients: prompt encoding (optional chat template), stop strings, end ids.

Subservers only see token ids; this is the one place that knows about the tokenizer. A model folder
with a tokenizer.json is read by tokenizer_files (tokenizers + jinja2: no transformers, no torch in
the stubs); a .gguf file or a folder without tokenizer.json falls back to transformers (hf_tokenizer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Protocol, Sequence

from .tokenizer_files import TOKENIZER_FILE, FileTokenizer

REPLACEMENT = "\ufffd"


class Tokenizer(Protocol):
    """What TextCodec and its users need of a tokenizer (FileTokenizer, HFTokenizer)."""

    chat_template: str | None
    eos_token_id: int | None
    pad_token_id: int | None
    unk_token_id: int | None

    def __len__(self) -> int: ...  # the whole vocabulary, added tokens included
    def token_to_id(self, token: str) -> int | None: ...
    def encode(self, text: str, add_special_tokens: bool) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...  # specials skipped, no space clean-up
    def render_chat(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True) -> str: ...


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer of an HF model folder or a .gguf file (offline)."""
    path = Path(path)
    if path.is_dir() and (path / TOKENIZER_FILE).is_file():
        return FileTokenizer(path)
    from .hf_tokenizer import HFTokenizer

    return HFTokenizer(path)


class TextCodec:
    def __init__(self, tokenizer: Tokenizer, *, chat_template: bool = False) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template

    @classmethod
    def from_path(cls, path: str | Path, *, chat_template: bool = False) -> "TextCodec":
        return cls(load_tokenizer(path), chat_template=chat_template)

    def encode_prompt(self, prompt: str, chat_template: bool | None = None) -> list[int]:
        """``chat_template``: wrap the prompt as one user turn (None: as configured)."""
        if self.chat_template if chat_template is None else chat_template:
            # The template writes every special token itself: none is added on encoding (as transformers does).
            rendered = self.tokenizer.render_chat([{"role": "user", "content": prompt}], add_generation_prompt=True)
            return self.tokenizer.encode(rendered, add_special_tokens=False)
        # Plain prompts get the tokenizer's own specials (a BOS for Llama; nothing for Qwen).
        return self.tokenizer.encode(prompt, add_special_tokens=True)

    def token_sequences(self, words: Iterable[str]) -> list[list[int]]:
        """Each non-empty string as token ids (stop words, bad words)."""
        return [ids for ids in (self.tokenizer.encode(w, add_special_tokens=False) for w in words if w) if ids]

    def end_ids(self, engine_eos: Iterable[int] = ()) -> list[int]:
        """Ids that end generation: the model's eos plus the tokenizer's (and <|im_end|> in chat mode)."""
        ids = set(engine_eos)
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        if self.chat_template:
            im_end = self.tokenizer.token_to_id("<|im_end|>")
            if im_end is not None and im_end != self.tokenizer.unk_token_id:
                ids.add(im_end)
        return sorted(ids)

    def decode(self, ids: Sequence[int]) -> str:
        # No space clean-up: chunked decoding must concatenate to the whole decode.
        return self.tokenizer.decode(ids)

    def stable_text(self, ids: Sequence[int], final: bool) -> str:
        """Decoded text without a trailing partial UTF-8 character (unless the output is final)."""
        text = self.decode(ids)
        return text if final else text.rstrip(REPLACEMENT)
