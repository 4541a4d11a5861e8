"""Text <-> token ids for clients: prompt encoding (optional chat template), stop strings, end ids.

Subservers only see token ids; this is the one place that knows about the tokenizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

REPLACEMENT = "\ufffd"


def load_tokenizer(path: str | Path):
    """A transformers tokenizer from an HF directory or a .gguf file (offline)."""
    from transformers import AutoTokenizer

    path = Path(path)
    if path.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return AutoTokenizer.from_pretrained(str(path))


class TextCodec:
    def __init__(self, tokenizer, *, chat_template: bool = False) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template

    @classmethod
    def from_path(cls, path: str | Path, *, chat_template: bool = False) -> "TextCodec":
        return cls(load_tokenizer(path), chat_template=chat_template)

    def encode_prompt(self, prompt: str, chat_template: bool | None = None) -> list[int]:
        """``chat_template``: wrap the prompt as one user turn (None: as configured)."""
        if self.chat_template if chat_template is None else chat_template:
            return list(self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True,
                return_dict=False))
        # Plain prompts get the tokenizer's own specials (a BOS for Llama; nothing for Qwen).
        return list(self.tokenizer.encode(prompt, add_special_tokens=True))

    def token_sequences(self, words: Iterable[str]) -> list[list[int]]:
        """Each non-empty string as token ids (stop words, bad words)."""
        return [ids for ids in (self.tokenizer.encode(w, add_special_tokens=False) for w in words if w) if ids]

    def end_ids(self, engine_eos: Iterable[int] = ()) -> list[int]:
        """Ids that end generation: the model's eos plus the tokenizer's (and <|im_end|> in chat mode)."""
        ids = set(engine_eos)
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        if self.chat_template:
            im_end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
            if isinstance(im_end, int) and im_end != self.tokenizer.unk_token_id:
                ids.add(im_end)
        return sorted(ids)

    def decode(self, ids: Sequence[int]) -> str:
        # No space clean-up: chunked decoding must concatenate to the whole decode.
        return self.tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def stable_text(self, ids: Sequence[int], final: bool) -> str:
        """Decoded text without a trailing partial UTF-8 character (unless the output is final)."""
        text = self.decode(ids)
        return text if final else text.rstrip(REPLACEMENT)
