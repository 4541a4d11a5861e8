"""An OpenAI request as the fronts' tensors (serving/schema.py): one front request per choice.

Each choice is its own generation, so a choice that meets a stop string, or a client that leaves,
ends exactly the calls it should. Choice i of a request with seed s samples with seed s + i, as
the fronts number ``num_return_sequences``. A request without a seed gets a random one when it
samples (OpenAI's sampling is not reproducible without one) and seed 0 when it is greedy: a seeded
routing policy (random) picks its route from the seed too, and greedy output should not vary.
The echo of completions and OpenAI's stop strings (cut before the stop, matched on text) are done by
the server (stops.py), so the fronts answer the output alone and never apply their chat template
(prompts come rendered or raw).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import numpy as np

from ..serving.schema import CLIENT_INPUTS

SEED_RANGE = 2**64
ALWAYS = {"exclude_input_in_output": True, "apply_chat_template": False, "return_num_input_tokens": True,
          "return_num_output_tokens": True}
READ = ("text_output", "finish_reason", "large_model_share", "num_input_tokens")
# A front's refusal names its tensor first: the OpenAI parameter each one came from (errors.from_triton)
PARAMS = {"text_input": "messages", "prompt": "messages", "max_tokens": "max_tokens", "temperature": "temperature",
          "top_p": "top_p", "seed": "seed", "stop_words": "stop", "presence_penalty": "presence_penalty",
          "frequency_penalty": "frequency_penalty", "top_k": "top_k", "min_tokens": "min_tokens",
          "repetition_penalty": "repetition_penalty"}
COMPLETION_PARAMS = {**PARAMS, "text_input": "prompt", "prompt": "prompt"}


@dataclass(frozen=True)
class Sampling:
    """What every choice of a request shares."""

    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stops: list[str]
    presence_penalty: float
    frequency_penalty: float
    logprobs: bool
    top_k: int
    min_tokens: int
    repetition_penalty: float
    stream: bool  # the OpenAI response streams (the front streams also when stop strings must be watched)
    end_ids: list[int] | None = None  # None: the front's default end ids


@dataclass(frozen=True)
class Choice:
    index: int  # in the response's choices
    prompt: str  # as the front gets it (a chat prompt rendered already)
    inputs: dict[str, np.ndarray]

    @property
    def outputs(self) -> tuple[str, ...]:
        return (*READ, "output_ids", "output_log_probs") if "return_log_probs" in self.inputs else (
            *READ, "num_output_tokens")


def choices(prompts: list[str], n: int, sampling: Sampling) -> list[Choice]:
    """Choice ``p * n + i`` is sample i of prompt p (OpenAI's order for completions)."""
    if sampling.seed is not None:
        seed = sampling.seed % SEED_RANGE
    else:
        seed = secrets.randbits(63) if sampling.temperature > 0 else 0
    return [Choice(p * n + i, prompt, front_inputs(prompt, sampling, (seed + i) % SEED_RANGE))
            for p, prompt in enumerate(prompts) for i in range(n)]


def front_inputs(prompt: str, sampling: Sampling, seed: int) -> dict[str, np.ndarray]:
    values: dict[str, object] = {
        "text_input": prompt, "max_tokens": sampling.max_tokens, "temperature": sampling.temperature,
        # sent always: a front reads a missing top_p as TensorRT-LLM's 0, which with top_k 0 is greedy
        "top_p": sampling.top_p, "seed": seed, "stream": sampling.stream or bool(sampling.stops), **ALWAYS}
    for name, off in (("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("top_k", 0), ("min_tokens", 0),
                      ("repetition_penalty", 1.0)):
        if getattr(sampling, name) != off:
            values[name] = getattr(sampling, name)
    if sampling.stops:  # the front stops at their tokens; stops.py finds them in the text too
        values["stop_words"] = sampling.stops
    if sampling.end_ids is not None:
        values["end_id"] = sampling.end_ids
    if sampling.logprobs:
        values["return_log_probs"] = True
    return {name: CLIENT_INPUTS[name].row(value) for name, value in values.items()}
