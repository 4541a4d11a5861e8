"""A Dynamo request (already tokenized by its frontend) made into ``TokenRouter.submit``'s keywords.

Each field Dynamo sends is either mapped, left to the frontend (stop strings, detokenizing), or
refused with Dynamo's ``InvalidArgument`` (the client sees an OpenAI-shaped 400) when it asks for
something the pair cannot do; a field at its neutral value is never refused, so a plain client works.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dynamo.llm.exceptions import InvalidArgument

# Dynamo's sampling option -> the embedded API's keyword
SAMPLING_KEYWORDS = {
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "seed": "seed",
    "repetition_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}
# What a field may hold and still mean "off" (Dynamo sends some options at their defaults).
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (None, 1), "best_of": (None, 1), "use_beam_search": (None, False), "length_penalty": (None, 1.0),
    "min_p": (None, 0.0), "guided_decoding": (None,), "include_stop_str_in_output": (None, False),
    "prompt_logprobs": (None, 0), "max_thinking_tokens": (None,), "skip_special_tokens": (None, True, False),
    "formatted_prompt": (None, True, False), "return_tokens_as_token_ids": (None, True, False),
}
STOP_TOKEN_FIELDS = ("stop_token_ids", "stop_token_ids_visible", "stop_token_ids_hidden")
HANDLED_BY_FRONTEND = {"stop"}  # stop strings: the frontend detokenizes and cuts there itself


@dataclass
class Mapped:
    prompt: list[int]
    keywords: dict[str, Any] = field(default_factory=dict)


def map_request(request: Mapping[str, Any]) -> Mapped:
    """The embedded API's call for a Dynamo ``GenerateRequest``; InvalidArgument names a refused field."""
    prompt = list(request.get("token_ids") or [])
    if not prompt:
        raise InvalidArgument("token_ids: the prompt is empty")
    for key in ("multi_modal_data", "prefill_result", "encoder_result", "mm_processor_kwargs"):
        if request.get(key):
            raise InvalidArgument(f"{key} is not supported by the TokenRouter engine")
    extra = {key: value for key, value in (request.get("extra_args") or {}).items() if key != "nvext"}
    if extra:  # nvext (extra_fields: ["engine_data"]) is the frontend's own; anything else we would ignore
        raise InvalidArgument(f"extra_args {sorted(extra)} are not supported by the TokenRouter engine")
    keywords: dict[str, Any] = {}
    sampling = dict(request.get("sampling_options") or {})
    if sampling.get("n") not in (None, 1):
        # Dynamo 1.6.1's frontend keeps one choice of an engine's multi-choice stream (seen: index 1 only)
        raise InvalidArgument(f"n={sampling['n']}: the TokenRouter engine serves one choice per request; "
                              "send n requests (with seeds seed, seed+1, ...)")
    sampling.pop("n", None)
    for key, value in sampling.items():
        if key in SAMPLING_KEYWORDS:
            if value is not None:
                keywords[SAMPLING_KEYWORDS[key]] = value
        else:
            _refuse_unless_neutral("sampling_options", key, value)
    stops = dict(request.get("stop_conditions") or {})
    for key in ("max_tokens", "min_tokens"):
        if (value := stops.pop(key, None)) is not None:
            keywords[key] = value
    keywords["ignore_eos"] = bool(stops.pop("ignore_eos", None))
    # The client's stop_token_ids and the model's end ids (hidden: the frontend drops them from the text)
    keywords["stop_token_ids"] = [int(token) for key in STOP_TOKEN_FIELDS for token in stops.pop(key, None) or []]
    for key, value in stops.items():
        if key not in HANDLED_BY_FRONTEND:
            _refuse_unless_neutral("stop_conditions", key, value)
    output = dict(request.get("output_options") or {})
    logprobs = output.pop("logprobs", None)
    if logprobs is not None:
        if logprobs not in (0, 1) or isinstance(logprobs, bool):
            # 1 is what the frontend sends for chat's logprobs=true without top_logprobs
            raise InvalidArgument(f"top_logprobs/logprobs={logprobs}: the TokenRouter engine returns the sampled "
                                  "token's log probability only (top_logprobs 0 or 1, no alternatives)")
        keywords["return_log_probs"] = True
    for key, value in output.items():
        _refuse_unless_neutral("output_options", key, value)
    return Mapped(prompt, keywords)


def _refuse_unless_neutral(group: str, key: str, value: Any) -> None:
    if value is None or value in NEUTRAL.get(key, ()):
        return
    raise InvalidArgument(f"{group}.{key}={value!r} is not supported by the TokenRouter engine")
