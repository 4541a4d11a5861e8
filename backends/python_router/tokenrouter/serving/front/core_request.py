"""A client's request to ``tensorrt_llm``, TensorRT-LLM's core model: token ids in -> generations.

Triton-free, like front_request.py, whose ``Generation`` it builds: the same entry call, the same
checks on the sampling values and the same fan-out limits as a front's request, read from
TensorRT-LLM's core inputs (tensorrtllm_backend c2e65b88, ``all_models/inflight_batcher_llm/
tensorrt_llm``). Every list input is bounded by its shape before any of it is read: a request
of 10^6 stop ids is refused in microseconds, not parsed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

import numpy as np

from ...protocol import RequestSpec
from ...request_builder import TENSORRT_LLM_SAMPLING_DEFAULTS, RequestError, build_spec, validate_spec_sampling
from ..schema import word_list_sequences
from ..text.text_inputs import TextInputs
from .front_request import (OFF_ONLY, SEED_RANGE, FanOutLimits, Generation, _Row, checked_row_flags,
                            generation_counts)

# Core inputs with no meaning here, refused whatever their value: why, in the client's terms.
CORE_REFUSED = {
    **{name: "draft-model speculative decoding is not supported"
       for name in ("draft_input_ids", "draft_logits", "draft_acceptance_threshold")},
    **{name: "prompt tuning is not supported; every model of a route reads the same token ids"
       for name in ("prompt_embedding_table", "prompt_table_extra_ids", "prompt_vocab_size")},
    **{name: "LoRA adapters are not supported (each model of a route would need its own)"
       for name in ("lora_task_id", "lora_weights", "lora_config")},
    **{name: "encoder-decoder and multimodal models only; the routed models are decoder-only text models"
       for name in ("encoder_input_features", "encoder_output_lengths", "cross_attention_mask",
                    "skip_cross_attn_blocks", "mrope_rotary_cos_sin", "mrope_position_deltas")},
    "context_phase_params": "disaggregated serving (a context phase on another server) is not supported",
    **{name: "KV cache retention priorities are not supported"
       for name in ("retention_token_range_starts", "retention_token_range_ends", "retention_token_range_priorities",
                    "retention_token_range_durations_ms", "retention_decode_priority",
                    "retention_decode_duration_ms")},
    **{name: "guided decoding is not implemented" for name in ("guided_decoding_guide_type", "guided_decoding_guide")},
    **{name: "lookahead decoding is not supported"
       for name in ("lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size")},
    **{name: "top-p decay is not implemented; send runtime_top_p alone"
       for name in ("runtime_top_p_min", "runtime_top_p_decay", "runtime_top_p_reset_ids")},
}
# Accepted only at the value that switches them off (the fronts' rules, under the same names).
CORE_OFF_ONLY = {**{name: OFF_ONLY[name] for name in (
    "beam_width", "return_context_logits", "return_generation_logits", "return_perf_metrics")},
    # a stop request never gets here: core_model.py answers it apart
    "stop": (False, "a stop request carries the request id of the request to stop (core_model.py)")}
# The core inputs that are RequestSpec's scalars under another name (the rest have RequestSpec's names).
SPEC_NAMES = {"request_output_len": "max_tokens", "runtime_top_k": "top_k", "runtime_top_p": "top_p",
              "temperature": "temperature", "repetition_penalty": "repetition_penalty",
              "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
              "min_tokens": "min_tokens", "min_length": "min_tokens", "seed": "seed", "random_seed": "seed",
              "return_log_probs": "return_log_probs"}
WORD_LISTS = {"stop_words_list": "stop", "bad_words_list": "bad"}


def parse_core_request(inputs: Mapping[str, np.ndarray], text: TextInputs, *, decoupled: bool,
                       limits: FanOutLimits = FanOutLimits(), exclude_input: bool = False,
                       wrap_ids: bool = False) -> list[Generation]:
    """Every generation of a core-model request; ``inputs`` by name, batch dimension first. Sizes are
    checked on the arrays' shapes before any value is read (``_check_sizes``). ``wrap_ids``
    (frontend.out_of_vocabulary_ids wrap): an input id >= the vocabulary size becomes id mod its size."""
    for name in inputs:
        if name in CORE_REFUSED:
            raise RequestError(f"{name}: {CORE_REFUSED[name]}")
    for name in ("input_ids", "input_lengths", "request_output_len"):
        if inputs.get(name) is None:
            raise RequestError(f"{name} is missing (TensorRT-LLM's core model requires it)")
    ids = inputs["input_ids"]
    rows = ids.shape[0]
    _check_sizes(inputs, text, rows)
    counts = generation_counts(inputs, rows, decoupled, limits, "tensorrt_llm")
    return [generation for r, count in enumerate(counts)
            for generation in _row_generations(_Row(inputs, r), r, count, text, decoupled, exclude_input, wrap_ids)]


def _check_sizes(inputs: Mapping[str, np.ndarray], text: TextInputs, rows: int) -> None:
    """O(1) bounds on every list input, from its shape (nothing is read or copied before them)."""
    ids = inputs["input_ids"]
    if ids.ndim != 2 or ids.shape[1] > text.max_context:
        raise RequestError(f"input_ids holds {ids.shape[-1]} ids a row; the limit is {text.max_context} "
                           "(the context limit)")
    for name, array in inputs.items():
        if name not in ("input_ids", "stop_words_list", "bad_words_list", "embedding_bias") and array.size > rows:
            raise RequestError(f"{name} must hold one value per row, got {array.size} for {rows} rows")
    for name in WORD_LISTS:
        words = inputs.get(name)
        if words is not None and (words.ndim != 3 or words.shape[1] != 2):
            raise RequestError(f"{name} must be [rows, 2, n] (TensorRT-LLM's word-list layout), "
                               f"got {list(words.shape)}")
        if words is not None and words.shape[2] > text.max_words:
            raise RequestError(f"{name} holds {words.shape[2]} ids a row; the limit is {text.max_words} "
                               "(frontend.max_words)")
    bias = inputs.get("embedding_bias")
    if bias is not None and bias.size > rows * text.vocab_size:
        raise RequestError(f"embedding_bias holds {bias.size} values; at most one per vocabulary entry "
                           f"({text.vocab_size}) a row")


def _row_generations(row: _Row, index: int, count: int, text: TextInputs, decoupled: bool,
                     exclude_input: bool, wrap_ids: bool) -> list[Generation]:
    stream = checked_row_flags(row, CORE_OFF_ONLY, ("len_penalty", "beam_search_diversity_rate"), "streaming", count,
                               decoupled, "tensorrt_llm", text)
    prompt_ids = _prompt(row, text, wrap_ids)
    spec = _spec(row, text, len(prompt_ids))
    echo = not stream and not row.value("exclude_input_in_output", exclude_input)
    return [Generation(index, n, prompt_ids, replace(spec, seed=(spec.seed + n) % SEED_RANGE), stream, echo)
            for n in range(count)]


def _prompt(row: _Row, text: TextInputs, wrap_ids: bool) -> list[int]:
    """The row's ``input_ids`` up to its ``input_lengths`` (the rest is padding), checked; with
    ``wrap_ids`` an id >= the vocabulary size is folded into it (negative ids are refused either way)."""
    ids = row.required("input_ids").reshape(-1)
    length = row.value("input_lengths")
    if not 1 <= length <= ids.size:
        raise RequestError(f"input_lengths {length} must be in [1, {ids.size}] (the ids in input_ids' row)")
    prompt = ids[:length]
    if wrap_ids:
        prompt = np.where(prompt >= 0, prompt % text.vocab_size, prompt)
    outside = prompt[(prompt < 0) | (prompt >= text.vocab_size)]
    if outside.size:
        raise RequestError(f"input_ids holds id {int(outside[0])}, outside the vocabulary [0, {text.vocab_size})")
    return prompt.tolist()


def _spec(row: _Row, text: TextInputs, prompt_len: int) -> RequestSpec:
    scalars: dict = {}
    for name, field in SPEC_NAMES.items():
        value = row.value(name)
        if value is None:
            continue
        if scalars.setdefault(field, value) != value:
            raise RequestError(f"{name} {value} disagrees with the {field} sent under another name; send one")
    sequences = {}
    for name, kind in WORD_LISTS.items():
        array = row.array(name)
        try:
            sequences[kind] = [] if array is None else word_list_sequences(array)
        except ValueError as err:
            raise RequestError(f"{name}: {err}") from None
        text.check_ids([t for sequence in sequences[kind] for t in sequence], name)
    spec = build_spec(prompt_len, scalars, defaults=TENSORRT_LLM_SAMPLING_DEFAULTS, end_ids=_end_ids(row, text),
                      stop_sequences=sequences["stop"], bad_sequences=sequences["bad"],
                      logit_bias=_embedding_bias(row.array("embedding_bias")))
    validate_spec_sampling(spec, text.vocab_size)
    return spec


def _end_ids(row: _Row, text: TextInputs) -> list[int]:
    """The row's end id; -1 (what TensorRT-LLM's client sends when it has no tokenizer) means none: the
    generation ends by length or a stop word only (the entry reads [-1] so)."""
    end_id = row.value("end_id")
    if end_id is None:
        return list(text.default_end_ids)
    if end_id == -1:
        return [-1]
    text.check_ids([end_id], "end_id")
    return [end_id]


def _embedding_bias(bias: np.ndarray | None) -> list[tuple[int, float]]:
    """TensorRT-LLM's embedding bias (one value per vocabulary entry) as (token id, bias) pairs."""
    if bias is None:
        return []
    bias = bias.reshape(-1)
    tokens = np.flatnonzero(bias)
    return list(zip(tokens.tolist(), bias[tokens].astype(float).tolist()))
