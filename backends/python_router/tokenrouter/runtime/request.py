"""A request as one subserver sees it, the client-facing pieces of a request, and the checks at submit
(what needs the model: vocabulary, context; the rest is request_builder.py's)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

from ..engine.base import SamplingParams
from ..protocol import RequestSpec, RequestView
from ..request_builder import RequestError, validate_spec_sampling


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
    # Per committed output token when ``spec.return_log_probs`` (else empty), and the sampled token's.
    logprobs: list[float] = field(default_factory=list)
    sampled_logprob: float | None = None
    here: bool = False
    sent_to: str | None = None  # the peer this model last handed it to (where it is while away)
    cached: int = 0  # context tokens this model's engine holds KV for
    ready_since: float = 0.0  # when it last became runnable here (the core's clock)

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @cached_property
    def sampling(self) -> SamplingParams:
        return SamplingParams.of_request(self.spec)  # the spec never changes

    def view(self) -> RequestView:
        """What a policy may see of this request (read-only; no copies of the context)."""
        return RequestView(rid=self.rid, model=self.model, model_index=self.model_index, token_ids=self.token_ids,
                           prompt_len=self.prompt_len, origins=self.origins, spec=self.spec, state=self.state,
                           known=self.known, sampled_token=self.sampled_token, logprobs=self.logprobs,
                           sampled_logprob=self.sampled_logprob)

    def commit(self, tokens: list[int], origins: list[int], logprobs: list[float | None]) -> None:
        if self.spec.return_log_probs:
            self.logprobs.extend(self._output_log_probs(logprobs))
        self.token_ids.extend(tokens)
        self.origins.extend(origins)

    def apply_suffix(self, anchor: int, tokens: list[int], origins: list[int], logprobs: list[float | None]) -> int:
        """Make the context ``context[:anchor] + tokens`` (a peer's newer view); returns how many
        tokens it grew by. ``origins`` and ``logprobs`` are aligned with ``tokens`` (prompt
        positions: origin -1, log probability None)."""
        old_len = len(self.token_ids)
        if anchor > old_len:
            raise ValueError(f"request {self.rid}: anchor {anchor} is past the known context ({old_len})")
        first_output = max(0, self.prompt_len - anchor)  # index in ``tokens`` of the first output position
        if self.spec.return_log_probs:  # checked before anything changes: a refused suffix leaves no trace
            if len(logprobs) != len(tokens):
                raise ValueError(f"request {self.rid}: {len(logprobs)} log probabilities for {len(tokens)} tokens")
            self.logprobs[max(0, anchor - self.prompt_len):] = self._output_log_probs(logprobs[first_output:])
        self.token_ids[anchor:] = tokens
        self.origins[max(0, anchor - self.prompt_len):] = origins[first_output:]
        return len(self.token_ids) - old_len

    def _output_log_probs(self, logprobs: list[float | None]) -> list[float]:
        """Output positions' log probabilities; only prompt positions may lack one (a peer that
        sends None for an output token is refused like one that sends too few)."""
        floats = [value for value in logprobs if value is not None]
        if len(floats) != len(logprobs):
            raise ValueError(f"request {self.rid}: an output token without a log probability")
        return floats

    def client_logprobs(self, count: int) -> list[float] | None:
        """The log probabilities of the last ``count`` output tokens for the client's sink (None
        when the request did not ask for them)."""
        if not self.spec.return_log_probs:
            return None
        return self.logprobs[len(self.logprobs) - count:]

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


def no_tokens_logprobs(spec: RequestSpec) -> list[float] | None:
    """What a sink's ``logprobs`` is with an output of no tokens (a finish alone)."""
    return [] if spec.return_log_probs else None


class ClientSink(Protocol):
    """Receives one request's output on the entry model's loop thread; must not block.

    Called once per group of newly committed tokens; the call that ends the request carries its
    ``finish_reason`` (and ``error``) together with its last tokens, so a streaming frontend can
    mark its last data response final. ``tokens`` may be empty only on that last call.
    ``logprobs`` is parallel to ``tokens`` when the request's ``return_log_probs`` is set, else
    None: each token's log probability at the model that sampled it
    (``engine.sampling.sampled_log_prob``: TensorRT-LLM's ``output_log_probs``).
    """

    def on_output(self, tokens: list[int], origins: list[int], finish_reason: str | None = None,
                  error: str | None = None, logprobs: list[float] | None = None) -> None: ...


@dataclass
class Submission:
    """A client request on its way into the entry subserver."""

    rid: str
    prompt_ids: list[int]
    spec: RequestSpec
    sink: ClientSink
    submitted_at: float = 0.0  # on the submitting loop's clock
    bypassed: int = 0  # later submissions admitted ahead of this one (admission bounds it)


def validate_submission(prompt_ids: list[int], spec: RequestSpec, *, max_model_len: int, vocab_size: int) -> None:
    """Raise RequestError naming what is wrong with a request before it takes any resource."""
    if not prompt_ids:
        raise RequestError("the prompt is empty")
    if any(not 0 <= t < vocab_size for t in prompt_ids):
        raise RequestError(f"prompt token ids must be in [0, {vocab_size})")
    validate_spec_sampling(spec, vocab_size)
    for what, ids in (("end_id", spec.end_ids), ("stop sequence", [t for seq in spec.stop_sequences for t in seq]),
                      ("bad word", [t for seq in spec.bad_sequences for t in seq])):
        outside = [t for t in ids if not 0 <= t < vocab_size]
        if outside:
            raise RequestError(f"{what} token ids {outside[:8]} are outside the vocabulary [0, {vocab_size})")
    if len(prompt_ids) >= max_model_len:
        raise RequestError(f"the prompt has {len(prompt_ids)} tokens; the limit is {max_model_len - 1}")
    if len(prompt_ids) + spec.max_tokens > max_model_len:
        raise RequestError(
            f"prompt ({len(prompt_ids)} tokens) + max_tokens ({spec.max_tokens}) exceeds the context "
            f"limit of {max_model_len}; lower max_tokens to at most {max_model_len - len(prompt_ids)}"
        )
