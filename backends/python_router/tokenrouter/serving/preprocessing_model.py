"""Triton model `preprocessing`: text_input -> input_ids; stop/bad words -> stop_ids/bad_ids; end ids.

Output shapes carry Triton's batch dimension of 1: input_ids [1, n], stop_ids [1, m] (each stop
sequence followed by -1), end_id [1, k] (the client's end_id, else the model's end ids).

Work before checks is bounded: text longer than a byte cap (input_limits.py) is refused before it
is decoded or tokenized.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..runtime.request import validate_sampling
from .input_limits import input_byte_cap
from .python_model import RequestError, TokenizerModel, input_array


def _text(value: Any, what: str, max_bytes: int) -> str:
    if not isinstance(value, bytes):
        raise RequestError(f"{what} must be a string")
    if len(value) > max_bytes:
        raise RequestError(f"{what} is {len(value)} bytes; the limit is {max_bytes} (the context holds fewer tokens)")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as err:
        raise RequestError(f"{what} is not valid UTF-8 ({err.reason} at byte {err.start})") from None


def _scalar(request: Any, name: str, default: float | int) -> float | int:
    array = input_array(request, name)
    if array is None:
        return default
    if array.size != 1:
        raise RequestError(f"{name} must hold one value, got {array.size}")
    return array.reshape(-1)[0].item()


def generation_eos(tokenizer_path: str) -> list[int]:
    """eos ids from the model folder's generation_config.json (Qwen lists <|endoftext|> there)."""
    path = Path(tokenizer_path) / "generation_config.json"
    if not path.is_file():
        return []
    eos = json.loads(path.read_text()).get("eos_token_id")
    return [eos] if isinstance(eos, int) else list(eos or [])


class TritonPythonModel(TokenizerModel):
    def initialize(self, args: dict[str, str]) -> None:
        super().initialize(args)
        self.vocab_size = len(self.codec.tokenizer)
        self.default_end_ids = self.codec.end_ids(generation_eos(self.tokenizer_path))
        self.max_input_bytes = input_byte_cap(self.parameters, self.tokenizer_path)

    def respond(self, request: Any) -> dict[str, np.ndarray]:
        # The sampling inputs also reach preprocessing so that they are checked before any
        # tokenizing, and so that a request without text_input still arrives here to be told so.
        validate_sampling(max_tokens=_scalar(request, "max_tokens", 1), temperature=_scalar(request, "temperature", 0.0),
                          top_p=_scalar(request, "top_p", 1.0), top_k=_scalar(request, "top_k", 0))
        texts = input_array(request, "text_input")
        if texts is None or texts.size == 0:
            raise RequestError("text_input is missing")
        prompt = _text(texts.reshape(-1)[0], "text_input", self.max_input_bytes)
        if not prompt:
            raise RequestError("text_input is empty")
        stop_ids = self._flat_sequences(request, "stop_words")
        bad_ids = self._flat_sequences(request, "bad_words")
        end_ids = input_array(request, "end_id")
        if end_ids is not None and end_ids.size:
            end = [int(i) for i in end_ids.reshape(-1)]
            bad = [i for i in end if not 0 <= i < self.vocab_size]
            if bad:
                raise RequestError(f"end_id {bad} outside the vocabulary [0, {self.vocab_size})")
        else:
            end = self.default_end_ids
        return {
            "input_ids": np.array([self.codec.encode_prompt(prompt)], dtype=np.int32),
            "stop_ids": np.array([stop_ids], dtype=np.int32).reshape(1, -1),
            "bad_ids": np.array([bad_ids], dtype=np.int32).reshape(1, -1),
            "end_id": np.array([end], dtype=np.int32).reshape(1, -1),
        }

    def _flat_sequences(self, request: Any, name: str) -> list[int]:
        """A list of words as token sequences, flattened with -1 after each (the subserver's format)."""
        array = input_array(request, name)
        raw = [] if array is None else array.reshape(-1)
        total = sum(len(word) for word in raw if isinstance(word, bytes))
        if total > self.max_input_bytes:
            raise RequestError(f"{name} hold {total} bytes; the limit is {self.max_input_bytes}")
        words = [_text(word, f"each of {name}", self.max_input_bytes) for word in raw]
        return [token for seq in self.codec.token_sequences(words) for token in (*seq, -1)]
