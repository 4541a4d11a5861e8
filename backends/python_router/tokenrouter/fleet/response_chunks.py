"""The chunks a worker's ``generate`` yields for one request (the replica's engine.py, the split pair's
entry_engine.py): each with its tokens and the model of each (``engine_data.models``); the last also
with the finish reason, the usage, and the whole response's models and large-model share (Dynamo's
frontend keeps only the last chunk's engine_data in a whole response)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from ..runtime.emission import large_model_share


class ResponseChunks:
    def __init__(self, prompt_len: int, names: Sequence[str], entry: str) -> None:
        self._prompt_len, self._names, self._entry = prompt_len, list(names), list(names).index(entry)
        self._origins: list[int] = []  # every token's model so far, by index in ``names``

    def chunk(self, tokens: list[int], origins: list[int], logprobs: list[float] | None,
              finish_reason: str | None) -> dict[str, Any]:
        self._origins += origins
        out: dict[str, Any] = {"token_ids": tokens, "index": 0,
                               "engine_data": {"models": [self._names[origin] for origin in origins]}}
        if logprobs is not None:
            out["log_probs"] = logprobs
        if finish_reason is not None:
            generated = len(self._origins)
            out["finish_reason"] = finish_reason
            out["completion_usage"] = {"prompt_tokens": self._prompt_len, "completion_tokens": generated,
                                       "total_tokens": self._prompt_len + generated}
            out["engine_data"].update(response_models=[self._names[origin] for origin in self._origins],
                                      large_model_share=large_model_share(Counter(self._origins), self._entry))
        return out
