"""transformers' AutoTokenizer behind FileTokenizer's methods, for what the fast path cannot read:
a .gguf file (its tokenizer is inside the model file) or a folder without tokenizer.json. Importing
transformers costs 4-5 CPU s (it imports torch), so only these paths pay it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence


class HFTokenizer:
    def __init__(self, path: str | Path) -> None:
        from transformers import AutoTokenizer

        path = Path(path)
        if path.suffix == ".gguf":
            self._tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        else:
            self._tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.chat_template = self._tokenizer.chat_template
        self.eos_token_id: int | None = self._tokenizer.eos_token_id
        self.pad_token_id: int | None = self._tokenizer.pad_token_id
        self.unk_token_id: int | None = self._tokenizer.unk_token_id

    def __len__(self) -> int:
        return len(self._tokenizer)

    def token_to_id(self, token: str) -> int | None:
        # transformers answers the unk id (or None) for a token outside the vocabulary
        found = self._tokenizer.convert_tokens_to_ids(token)
        return found if isinstance(found, int) and found != self.unk_token_id else None

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def render_chat(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        return self._tokenizer.apply_chat_template(list(messages), add_generation_prompt=add_generation_prompt,
                                                   tokenize=False)
