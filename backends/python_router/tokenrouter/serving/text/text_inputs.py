"""Text inputs as token ids: the prompt, stop and bad words, embedding-bias words, end ids.

Shared by the front models and the standalone preprocessing model, so both refuse the same input
with the same message. Work before checks is bounded: text longer than a byte cap
(input_limits.py) is refused before it is decoded or tokenized.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ...config import FrontendSpec
from ...request_builder import RequestError
from ...text import TextCodec
from .input_limits import context_limit, input_byte_cap


def generation_eos(tokenizer_path: str) -> list[int]:
    """eos ids from the model folder's generation_config.json (Qwen lists <|endoftext|> there)."""
    path = Path(tokenizer_path) / "generation_config.json"
    if not path.is_file():
        return []
    eos = json.loads(path.read_text()).get("eos_token_id")
    return [eos] if isinstance(eos, int) else list(eos or [])


def _text(value: Any, what: str, max_bytes: int) -> str:
    if not isinstance(value, bytes):
        raise RequestError(f"{what} must be a string")
    if len(value) > max_bytes:
        raise RequestError(f"{what} is {len(value)} bytes; the limit is {max_bytes} (the context holds fewer tokens)")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as err:
        raise RequestError(f"{what} is not valid UTF-8 ({err.reason} at byte {err.start})") from None


class TextInputs:
    def __init__(self, codec: TextCodec, tokenizer_path: str, parameters: dict[str, str]) -> None:
        """``parameters``: the model's config parameters (``max_model_len``, ``max_input_bytes``
        size the byte cap)."""
        self.codec = codec
        self.vocab_size = len(codec.tokenizer)
        self.default_end_ids = codec.end_ids(generation_eos(tokenizer_path))
        self.max_input_bytes = input_byte_cap(parameters, tokenizer_path)
        self.max_context = context_limit(parameters, tokenizer_path)  # tokens in the longest context
        self.max_words = int(parameters.get("max_words") or FrontendSpec.model_fields["max_words"].default)

    def prompt_ids(self, texts: np.ndarray | None, chat_template: bool | None = None) -> list[int]:
        """One row's ``text_input`` as the prompt's token ids, wrapped in the chat template when
        ``chat_template`` says so (None: when configured)."""
        if texts is None or texts.size == 0:
            raise RequestError("text_input is missing")
        prompt = _text(texts.reshape(-1)[0], "text_input", self.max_input_bytes)
        if not prompt:
            raise RequestError("text_input is empty")
        return self.codec.encode_prompt(prompt, chat_template)

    def words(self, array: np.ndarray | None, name: str) -> list[str]:
        """One row of a list of words (stop_words, bad_words, embedding_bias_words), empty ones kept."""
        if array is not None and array.size > self.max_words:  # before any copy: empty words weigh 0 bytes
            raise RequestError(f"{name} holds {array.size} words; the limit is {self.max_words} (frontend.max_words)")
        raw = [] if array is None else list(array.reshape(-1))
        total = sum(len(word) for word in raw if isinstance(word, bytes))
        if total > self.max_input_bytes:
            raise RequestError(f"{name} hold {total} bytes; the limit is {self.max_input_bytes}")
        return [_text(word, f"each of {name}", self.max_input_bytes) for word in raw]

    def sequences(self, array: np.ndarray | None, name: str) -> list[list[int]]:
        """A list of words as token sequences (empty words dropped, as TensorRT-LLM's clients send "")."""
        return self.codec.token_sequences(self.words(array, name))

    def end_ids(self, array: np.ndarray | None) -> list[int]:
        """The client's end ids, checked against the vocabulary; else the model's (and the chat template's)."""
        if array is None or array.size == 0:
            return list(self.default_end_ids)
        if array.size > self.max_words:  # before any copy: 10^6 of them took a front 3 s
            raise RequestError(f"end_id holds {array.size} ids; the limit is {self.max_words} (frontend.max_words)")
        ids = [int(i) for i in array.reshape(-1)]
        self.check_ids(ids, "end_id")
        return ids

    def check_ids(self, ids: Sequence[int], name: str) -> None:
        outside = [i for i in ids if not 0 <= i < self.vocab_size]
        if outside:
            raise RequestError(f"{name} {outside[:8]} outside the vocabulary [0, {self.vocab_size})")

    def logit_bias(self, words: np.ndarray | None, weights: np.ndarray | None) -> list[tuple[int, float]]:
        """TensorRT-LLM's embedding bias: each word's weight added to the logit of every token of
        the word (a token in several words gets their sum)."""
        texts = self.words(words, "embedding_bias_words")
        if weights is not None and weights.size > self.max_words:
            raise RequestError(f"embedding_bias_weights holds {weights.size} weights; the limit is {self.max_words} "
                               "(frontend.max_words)")
        values = [] if weights is None else [float(w) for w in weights.reshape(-1)]
        if len(texts) != len(values):
            raise RequestError(f"embedding_bias_words has {len(texts)} words and embedding_bias_weights "
                               f"{len(values)} weights; give one weight per word")
        bias = []
        for word, weight in zip(texts, values):
            if math.isnan(weight) or weight == math.inf:
                raise RequestError(f"embedding_bias_weights: the weight of {word!r} must be a number below +inf, "
                                   f"got {weight}")
            bias += [(token, weight) for sequence in self.codec.token_sequences([word]) for token in sequence]
        return bias
