"""A request as one subserver sees it, and the client-facing pieces of a request."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from ..engine.base import SamplingParams
from ..protocol import RequestSpec, RequestView

FINISH_REASONS = ("eos", "stop", "length", "cancelled", "error")


class RequestError(ValueError):
    """Bad input on one request (empty prompt, too long, bad sampling values); others go on."""


@dataclass
class RequestState:
    """Per-model record, owned by one subserver core. ``here`` is True while this model holds the
    request (runnable); False while it is pending elsewhere, with its KV kept in this model's pool."""

    rid: str
    model: str  # this subserver's model
    model_index: int  # its position in the config's model list (used for attribution)
    token_ids: list[int]  # committed context: prompt + committed output tokens
    prompt_len: int
    origins: list[int]  # model index that produced each committed output token
    spec: RequestSpec
    state: dict[str, Any] = field(default_factory=dict)  # the policy's slot; travels with the request
    known: dict[str, int] = field(default_factory=dict)  # tokens each peer has seen (its anchor)
    sampled_token: int | None = None  # sampled in this step here; not committed yet
    here: bool = False
    cached: int = 0  # context tokens this model's engine holds KV for
    ready_since: float = 0.0  # when it last became runnable here (the core's clock)

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.spec.temperature, self.spec.top_p, self.spec.top_k, self.spec.seed)

    def view(self) -> RequestView:
        """What a policy may see of this request (read-only; no copies of the context)."""
        return RequestView(rid=self.rid, model=self.model, model_index=self.model_index, token_ids=self.token_ids,
                           prompt_len=self.prompt_len, origins=self.origins, spec=self.spec, state=self.state,
                           known=self.known, sampled_token=self.sampled_token)

    def commit(self, tokens: list[int], origins: list[int]) -> None:
        self.token_ids.extend(tokens)
        self.origins.extend(origins)

    def apply_suffix(self, anchor: int, tokens: list[int], origins: list[int]) -> int:
        """Make the context ``context[:anchor] + tokens`` (a peer's newer view); returns how many
        tokens it grew by. ``origins`` is aligned with ``tokens`` (-1 for prompt positions)."""
        old_len = len(self.token_ids)
        if anchor > old_len:
            raise ValueError(f"request {self.rid}: anchor {anchor} is past the known context ({old_len})")
        self.token_ids[anchor:] = tokens
        generated = [origin for k, origin in enumerate(origins) if anchor + k >= self.prompt_len]
        self.origins[max(0, anchor - self.prompt_len):] = generated
        return len(self.token_ids) - old_len

    def finish_reason(self, max_model_len: int) -> str | None:
        """Why the request is done after its last commit, or None to go on."""
        spec = self.spec
        generated = self.num_generated
        if generated > 0:
            last = self.token_ids[-1]
            if last in spec.end_ids:
                return "eos"
            for stop in spec.stop_sequences:
                if stop and generated >= len(stop) and self.token_ids[-len(stop):] == stop:
                    return "stop"
        if generated >= spec.max_tokens or len(self.token_ids) >= max_model_len:
            return "length"
        return None


class ClientSink(Protocol):
    """Receives one request's output on the entry model's loop thread; must not block.

    Called once per group of newly committed tokens; the call that ends the request carries its
    ``finish_reason`` (and ``error``) together with its last tokens, so a streaming frontend can
    mark its last data response final. ``tokens`` may be empty only on that last call.
    """

    def on_output(self, tokens: list[int], origins: list[int], finish_reason: str | None = None,
                  error: str | None = None) -> None: ...


@dataclass
class Submission:
    """A client request on its way into the entry subserver."""

    rid: str
    prompt_ids: list[int]
    spec: RequestSpec
    sink: ClientSink
    submitted_at: float = 0.0  # on the submitting loop's clock
    bypassed: int = 0  # later submissions admitted ahead of this one (admission bounds it)


def validate_sampling(*, max_tokens: int, temperature: float, top_p: float, top_k: int) -> None:
    """Checks that need no model facts (the frontend runs them before tokenizing, too)."""
    if max_tokens < 1:
        raise RequestError(f"max_tokens must be >= 1, got {max_tokens}")
    if not temperature >= 0:  # also refuses NaN
        raise RequestError(f"temperature must be >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise RequestError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise RequestError(f"top_k must be >= 0, got {top_k}")


def validate_submission(prompt_ids: list[int], spec: RequestSpec, *, max_model_len: int, vocab_size: int) -> None:
    """Raise RequestError naming what is wrong with a request before it takes any resource."""
    if not prompt_ids:
        raise RequestError("the prompt is empty")
    if any(not 0 <= t < vocab_size for t in prompt_ids):
        raise RequestError(f"prompt token ids must be in [0, {vocab_size})")
    validate_sampling(max_tokens=spec.max_tokens, temperature=spec.temperature, top_p=spec.top_p, top_k=spec.top_k)
    if len(prompt_ids) >= max_model_len:
        raise RequestError(f"the prompt has {len(prompt_ids)} tokens; the limit is {max_model_len - 1}")
    if len(prompt_ids) + spec.max_tokens > max_model_len:
        raise RequestError(
            f"prompt ({len(prompt_ids)} tokens) + max_tokens ({spec.max_tokens}) exceeds the context "
            f"limit of {max_model_len}; lower max_tokens to at most {max_model_len - len(prompt_ids)}"
        )
