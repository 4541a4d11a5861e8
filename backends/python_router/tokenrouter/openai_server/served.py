"""What a TokenRouter repository serves, as the OpenAI server needs it: the client-facing model
names, the routing policy's name, the model pair's tokenizer and chat template, the limits.

Read once at start from the repository's config.pbtxt files (serving/repository.py), the same ones
Triton serves, so the names and limits are the fronts' own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..serving.text.input_limits import context_limit, input_byte_cap
from ..serving.repository import model_parameters, read_repository
from ..serving.text.text_inputs import generation_eos
from ..text import TextCodec

MIN_BODY_BYTES = 1 << 20
BODY_BYTES_PER_TEXT_BYTE = 8  # JSON escapes a control character as 6 bytes; messages add their keys


@dataclass
class ServedPair:
    fronts: tuple[str, ...]  # the client-facing models: frontend.names
    policy: str
    codec: TextCodec  # the entry model's tokenizer, chat end ids on
    chat_end_ids: list[int]  # what ends a chat reply: the model's end ids and the template's <|im_end|>
    context_limit: int  # prompt + output tokens
    max_choices: int  # n: frontend.max_return_sequences
    max_generations: int  # prompts x n: frontend.max_generations
    max_prompt_bytes: int  # the fronts' text cap: no prompt that fits the context is longer
    max_body_bytes: int
    created: int  # when the repository was written, for /v1/models

    @classmethod
    def from_repository(cls, repository: Path) -> "ServedPair":
        config = read_repository(repository)
        tokenizer_path = config.tokenizer_path
        if not tokenizer_path:
            raise ValueError(f"{repository}: no tokenizer (set 'tokenizer' or the entry model's path)")
        front = model_parameters(Path(repository) / config.frontend.names[0])
        codec = TextCodec.from_path(tokenizer_path, chat_template=True)
        text_bytes = input_byte_cap(front, tokenizer_path)
        return cls(fronts=tuple(config.frontend.names), policy=config.policy.name, codec=codec,
                   chat_end_ids=codec.end_ids(generation_eos(tokenizer_path)),
                   context_limit=context_limit(front, tokenizer_path),
                   max_choices=config.frontend.max_return_sequences, max_generations=config.frontend.max_generations,
                   max_prompt_bytes=text_bytes,
                   max_body_bytes=max(MIN_BODY_BYTES, BODY_BYTES_PER_TEXT_BYTE * text_bytes),
                   created=int((Path(repository) / config.frontend.names[0] / "config.pbtxt").stat().st_mtime))

    @property
    def has_chat_template(self) -> bool:
        return bool(self.codec.tokenizer.chat_template)

    def render_chat(self, messages: Sequence[dict[str, Any]]) -> str:
        """The conversation as the model's chat template writes it, ready for the assistant's turn."""
        return self.codec.tokenizer.render_chat(messages, add_generation_prompt=True)

    def models(self) -> list[dict[str, Any]]:
        """/v1/models' data."""
        return [{"id": name, "object": "model", "created": self.created, "owned_by": "tokenrouter"}
                for name in self.fronts]
