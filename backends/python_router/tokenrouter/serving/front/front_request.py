"""A client's request to a front model, read and checked: TensorRT-LLM's inputs -> generations.

Triton-free (numpy arrays in, plain objects out), so every rule is unit-tested without a server
(tests/serving/test_front_request.py, which also holds docs/compatibility.md's input table to REFUSED
and OFF_ONLY).
Each batch row is its own generation, and so is each of its ``num_return_sequences`` sequences.
Every error names its input: a request is refused as a whole, before any generation starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

import numpy as np

from ...config import FrontendSpec
from ...protocol import RequestSpec
from ...request_builder import TENSORRT_LLM_SAMPLING_DEFAULTS, RequestError, build_spec, validate_spec_sampling
from ..schema import SPEC_SCALARS, SUBSERVER_INPUTS, flatten_sequences
from ..text.text_inputs import TextInputs

SEED_RANGE = 2**64

# Inputs with no meaning here, refused whatever their value: why, in the client's terms.
REFUSED = {
    "decoder_text_input": "encoder-decoder models only; the routed models are decoder-only",
    "image_input": "multimodal input is not supported; the routed models take text",
    "image_bytes_input": "multimodal input is not supported; the routed models take text",
    "image_url_input": "multimodal input is not supported; the routed models take text",
    "video_bytes_input": "multimodal input is not supported; the routed models take text",
    "prompt_embedding_table": "prompt tuning is not supported; every model of a route reads the same token ids",
    "prompt_vocab_size": "prompt tuning is not supported; every model of a route reads the same token ids",
    "prompt_table_extra_id": "prompt tuning is not supported; every model of a route reads the same token ids",
    "lora_task_id": "LoRA adapters are not supported (each model of a route would need its own)",
    "lora_weights": "LoRA adapters are not supported (each model of a route would need its own)",
    "lora_config": "LoRA adapters are not supported (each model of a route would need its own)",
    "guided_decoding_guide_type": "guided decoding is not implemented",
    "guided_decoding_guide": "guided decoding is not implemented",
}
# Inputs accepted only at the value that switches them off: (that value, why no other).
OFF_ONLY = {
    "beam_width": (1, "beam search is not supported: routing hands single sampled tokens between models"),
    "return_context_logits": (False, "the engines compute logits only for the last prompt position"),
    "return_generation_logits": (False, "a routed response's tokens come from several models whose full "
                                        "distributions are not sent to the front; use return_log_probs"),
    "return_perf_metrics": (False, "per-request KV and timing figures are not collected across the routed models; "
                                   "the metrics port has them per model "
                                   "(nv_trt_llm_*, tokenrouter_queue_wait_seconds)"),
    "num_draft_tokens": (0, "draft-model speculative decoding is not supported"),
    "use_draft_logits": (False, "draft-model speculative decoding is not supported"),
}


@dataclass(frozen=True)
class Generation:
    """One generation of a request: a batch row's prompt, or one of its num_return_sequences."""

    row: int  # batch_index
    sequence: int  # sequence_index
    prompt_ids: list[int]
    spec: RequestSpec
    stream: bool
    echo_prompt: bool  # non-streaming text starts with the prompt (exclude_input_in_output false)
    count_input: bool = False  # answer num_input_tokens (return_num_input_tokens)
    count_output: bool = False  # answer num_output_tokens (return_num_output_tokens)

    def entry_inputs(self) -> dict[str, np.ndarray]:
        """The entry subserver's inputs (schema.SUBSERVER_INPUTS), one batch row each."""
        spec = self.spec
        values: dict[str, Any] = {name: getattr(spec, name) for name in SPEC_SCALARS}
        values.update(input_ids=self.prompt_ids, stream=self.stream, end_id=spec.end_ids,
                      stop_ids=flatten_sequences(spec.stop_sequences), bad_ids=flatten_sequences(spec.bad_sequences),
                      logit_bias_ids=[token for token, _ in spec.logit_bias],
                      logit_bias_weights=[weight for _, weight in spec.logit_bias])
        return {name: SUBSERVER_INPUTS[name].row(value) for name, value in values.items()}


class _Row:
    """One batch row of the request's inputs."""

    def __init__(self, inputs: Mapping[str, np.ndarray], row: int) -> None:
        self._inputs, self._row = inputs, row

    def array(self, name: str) -> np.ndarray | None:
        array = self._inputs.get(name)
        return None if array is None else array[self._row]

    def required(self, name: str) -> np.ndarray:
        """An input the request was checked to carry before its rows are read."""
        array = self.array(name)
        if array is None:
            raise RequestError(f"{name} is missing")
        return array

    def value(self, name: str, default: Any = None) -> Any:
        """A [1]-shaped input as a Python scalar (numpy's .item(): the dtype the schema declares)."""
        array = self.array(name)
        if array is None:
            return default
        if array.size != 1:
            raise RequestError(f"{name} must hold one value per row, got {array.size}")
        return array.reshape(-1)[0].item()


@dataclass(frozen=True)
class FanOutLimits:
    """How many generations one request may start (config ``frontend``; front parameters)."""

    max_return_sequences: int = FrontendSpec.model_fields["max_return_sequences"].default
    max_generations: int = FrontendSpec.model_fields["max_generations"].default

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, str]) -> "FanOutLimits":
        return cls(**{name: int(parameters[name]) for name in ("max_return_sequences", "max_generations")
                      if parameters.get(name)})


def parse_request(inputs: Mapping[str, np.ndarray], text: TextInputs, *, decoupled: bool,
                  limits: FanOutLimits = FanOutLimits(), exclude_input: bool = False) -> list[Generation]:
    """Every generation of a request; ``inputs``: the client's tensors by name, batch dimension first.

    ``decoupled`` False (a unary front): one response per request, so one generation, no streaming.
    The number of generations is checked against ``limits`` before any of them is built.
    ``exclude_input``: what a row without ``exclude_input_in_output`` gets (the front's setting)."""
    for name in inputs:
        if name in REFUSED:
            raise RequestError(f"{name}: {REFUSED[name]}")
    texts = inputs.get("text_input")
    if texts is None or texts.size == 0:
        raise RequestError("text_input is missing")
    counts = generation_counts(inputs, texts.shape[0], decoupled, limits, "front")
    return [generation for r, count in enumerate(counts)
            for generation in _row_generations(_Row(inputs, r), r, count, text, decoupled, exclude_input)]


def generation_counts(inputs: Mapping[str, np.ndarray], rows: int, decoupled: bool, limits: FanOutLimits,
                      model: str) -> list[int]:
    """How many generations each of the ``rows`` starts, checked against ``limits`` before any is built;
    a unary ``model`` takes one row."""
    if not decoupled and rows > 1:
        raise RequestError(f"a batch of {rows} rows needs a decoupled {model} (one response per row); this one is "
                           "unary: send one row per request")
    counts = [_sequence_count(_Row(inputs, r), limits) for r in range(rows)]
    if sum(counts) > limits.max_generations:
        raise RequestError(f"{rows} rows x num_return_sequences make {sum(counts)} generations; the limit per request "
                           f"is {limits.max_generations} (frontend.max_generations)")
    return counts


def _sequence_count(row: _Row, limits: FanOutLimits) -> int:
    count = row.value("num_return_sequences", 1)
    if count < 1:
        raise RequestError(f"num_return_sequences must be >= 1, got {count}")
    if count > limits.max_return_sequences:
        raise RequestError(f"num_return_sequences {count} is over the limit of {limits.max_return_sequences} "
                           "(frontend.max_return_sequences)")
    return count


def checked_row_flags(row: _Row, off_only: Mapping[str, tuple[Any, str]], no_effect: tuple[str, ...], stream_input: str,
                      count: int, decoupled: bool, model: str, text: TextInputs) -> bool:
    """The checks a row of a front or of ``tensorrt_llm`` takes before its prompt is read: ``off_only``
    inputs off, ``no_effect`` floats finite, streaming and several sequences only where ``model`` is
    decoupled, ``pad_id`` inside the vocabulary. Returns whether the row streams (``stream_input``)."""
    for name, (off, why) in off_only.items():
        value = row.value(name, off)
        if value != off:
            raise RequestError(f"{name} {value!r}: only {off!r} is accepted; {why}")
    for name in no_effect:
        value = row.value(name, 0.0)
        if not math.isfinite(value):
            raise RequestError(f"{name} must be a finite number (it has no effect without beams), got {value}")
    stream = bool(row.value(stream_input, False))
    if not decoupled and (stream or count > 1):
        what = f"{stream_input} true" if stream else f"num_return_sequences {count}"
        raise RequestError(f"{what} needs a decoupled {model} (several responses per request); this one is unary")
    pad_id = row.value("pad_id")
    if pad_id is not None:
        text.check_ids([pad_id], "pad_id")  # accepted, no effect: responses are never padded
    return stream


def _row_generations(row: _Row, index: int, count: int, text: TextInputs, decoupled: bool,
                     exclude_input: bool) -> list[Generation]:
    stream = checked_row_flags(row, OFF_ONLY, ("length_penalty",), "stream", count, decoupled, "front", text)
    prompt_ids = text.prompt_ids(row.array("text_input"), row.value("apply_chat_template"))
    spec = _spec(row, text, len(prompt_ids))
    echo = not stream and not row.value("exclude_input_in_output", exclude_input)
    counts = bool(row.value("return_num_input_tokens", False)), bool(row.value("return_num_output_tokens", False))
    return [Generation(index, n, prompt_ids, replace(spec, seed=(spec.seed + n) % SEED_RANGE), stream, echo, *counts)
            for n in range(count)]


def _spec(row: _Row, text: TextInputs, prompt_len: int) -> RequestSpec:
    """The row's sampling and output constraints, checked (the entry checks them against its context)."""
    scalars = {name: value for name in SPEC_SCALARS if (value := row.value(name)) is not None}
    old_seed = row.value("random_seed")
    if old_seed is not None:
        if scalars.setdefault("seed", old_seed) != old_seed:
            raise RequestError(f"seed {scalars['seed']} and random_seed {old_seed} disagree; send one of them")
    spec = build_spec(prompt_len, scalars, defaults=TENSORRT_LLM_SAMPLING_DEFAULTS,
                      end_ids=text.end_ids(row.array("end_id")),
                      stop_sequences=text.sequences(row.array("stop_words"), "stop_words"),
                      bad_sequences=text.sequences(row.array("bad_words"), "bad_words"),
                      logit_bias=text.logit_bias(row.array("embedding_bias_words"),
                                                 row.array("embedding_bias_weights")))
    validate_spec_sampling(spec, text.vocab_size)
    return spec
