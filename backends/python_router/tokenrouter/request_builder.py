"""A client's request made into a ``RequestSpec``: the defaults, the sampling checks, ``RequestError``.

Three places build a request, all through ``build_spec``: a front, from TensorRT-LLM's inputs
(serving/front/front_request.py); the entry subserver, from its token-level inputs
(serving/subserver/intake.py); and the embedded API (``TokenRouter.submit``, runtime/api.py). So a
missing ``max_tokens`` means ``DEFAULT_MAX_TOKENS`` on every path.

Imports no engine and no torch (numpy and protocol.py only): the fronts and the pre/postprocessing
models build and check requests without loading an engine (tests/serving/test_torch_free_imports.py).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from .protocol import RequestSpec

DEFAULT_MAX_TOKENS = 16  # TensorRT-LLM requires max_tokens; OpenAI's completions default to 16
# What TensorRT-LLM reads for a sampling input that is not sent. top_k 0 and top_p 0 together mean
# greedy, so temperature alone (its ensemble client always sends 1.0) does not turn sampling on,
# and top_k or top_p alone samples at temperature 1 (docs/compatibility.md, "Inputs"). The fronts
# read TensorRT-LLM's inputs with these; the entry subserver and the embedded API keep
# RequestSpec's own (temperature 0, top_p 1).
TENSORRT_LLM_SAMPLING_DEFAULTS: Mapping[str, Any] = {"temperature": 1.0, "top_k": 0, "top_p": 0.0}


class RequestError(ValueError):
    """Bad input on one request (empty prompt, too long, bad sampling values); others go on."""


def build_spec(prompt_len: int, sent: Mapping[str, Any], *, defaults: Mapping[str, Any] | None = None,
               end_ids: Iterable[int] = (), stop_sequences: Iterable[Sequence[int]] = (),
               bad_sequences: Iterable[Sequence[int]] = (),
               logit_bias: Iterable[Sequence[Any]] = ()) -> RequestSpec:
    """The spec of a request whose client sent the scalar fields ``sent`` (RequestSpec's names).

    A field not sent takes ``defaults``' value, then ``DEFAULT_MAX_TOKENS`` for ``max_tokens`` and
    RequestSpec's own default for the rest. Nothing is checked here: ``validate_spec_sampling``
    checks what needs no model, the runtime the rest at submit (runtime/request.py)."""
    return RequestSpec(prompt_len=prompt_len, **{"max_tokens": DEFAULT_MAX_TOKENS, **(defaults or {}), **sent},
                       end_ids=list(end_ids), stop_sequences=[list(seq) for seq in stop_sequences],
                       bad_sequences=[list(seq) for seq in bad_sequences],
                       logit_bias=[tuple(pair) for pair in logit_bias])


def validate_sampling(*, max_tokens: int, temperature: float, top_p: float, top_k: int,
                      repetition_penalty: float = 1.0, presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                      min_tokens: int = 0, logit_bias: Sequence[Sequence[Any]] = (), return_log_probs: bool = False,
                      vocab_size: int | None = None) -> None:
    """Checks that need no model facts but the vocabulary size, which bias ids need (the frontend
    runs them before tokenizing, without it). Each error names its input.

    ``top_p`` 0 is TensorRT-LLM's "unset" (no nucleus filter; greedy when ``top_k`` is 0 too).
    ``min_tokens`` above ``max_tokens`` is allowed, as in TensorRT-LLM: the request then never
    ends by an end id."""
    if _integer(max_tokens, "max_tokens") < 1:
        raise RequestError(f"max_tokens must be >= 1, got {max_tokens}")
    if not _real(temperature, "temperature") >= 0 or math.isinf(temperature):  # `not >=` also refuses NaN
        raise RequestError(f"temperature must be a finite number >= 0, got {temperature}")
    if not 0 <= _real(top_p, "top_p") <= 1:
        raise RequestError(f"top_p must be in [0, 1] (0: unset), got {top_p}")
    if _integer(top_k, "top_k") < 0:
        raise RequestError(f"top_k must be >= 0, got {top_k}")
    if not (math.isfinite(_real(repetition_penalty, "repetition_penalty")) and repetition_penalty > 0):
        raise RequestError(f"repetition_penalty must be a finite number > 0 (1: off), got {repetition_penalty}")
    for name, value in (("presence_penalty", presence_penalty), ("frequency_penalty", frequency_penalty)):
        if not math.isfinite(_real(value, name)):
            raise RequestError(f"{name} must be a finite number (0: off), got {value}")
    if _integer(min_tokens, "min_tokens") < 0:
        raise RequestError(f"min_tokens must be >= 0, got {min_tokens}")
    if not isinstance(return_log_probs, (bool, np.bool_)):
        raise RequestError(f"return_log_probs must be a boolean, got {return_log_probs!r}")
    _check_logit_bias(logit_bias, vocab_size)


def validate_spec_sampling(spec: RequestSpec, vocab_size: int | None) -> None:
    """validate_sampling on a RequestSpec's fields."""
    validate_sampling(max_tokens=spec.max_tokens, temperature=spec.temperature, top_p=spec.top_p, top_k=spec.top_k,
                      repetition_penalty=spec.repetition_penalty, presence_penalty=spec.presence_penalty,
                      frequency_penalty=spec.frequency_penalty, min_tokens=spec.min_tokens, logit_bias=spec.logit_bias,
                      return_log_probs=spec.return_log_probs, vocab_size=vocab_size)


def _check_logit_bias(logit_bias: Sequence[Sequence[Any]], vocab_size: int | None) -> None:
    """(token id, weight) pairs; a weight of -inf bans its token, +inf or NaN is refused."""
    if isinstance(logit_bias, (str, bytes)) or not isinstance(logit_bias, Sequence):
        raise RequestError(f"logit_bias must be a list of (token id, weight) pairs, got {logit_bias!r}")
    for pair in logit_bias:
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise RequestError(f"logit_bias must be a list of (token id, weight) pairs, got the entry {pair!r}")
        token = _integer(pair[0], "logit_bias token id")
        weight = _real(pair[1], "logit_bias weight")
        if vocab_size is not None and not 0 <= token < vocab_size:
            raise RequestError(f"logit_bias token id {token} is outside the vocabulary [0, {vocab_size})")
        if math.isnan(weight) or weight == math.inf:
            raise RequestError(f"logit_bias weight for token {token} must be a number below +inf, got {weight}")


def _real(value: Any, name: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise RequestError(f"{name} must be a number, got {value!r}")
    return float(value)


def _integer(value: Any, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise RequestError(f"{name} must be an integer, got {value!r}")
    return int(value)
