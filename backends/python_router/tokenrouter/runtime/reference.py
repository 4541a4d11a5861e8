"""The naive reference for routed decoding: one request at a time, no batching, no KV cache, each
step recomputed from the whole context. The oracle tests hold the served runtime to
token-for-token equality with this.

It shares nothing with the runtime but the policy interface (``tokenrouter.protocol``) and the
engine's sampler (temperature, top-k, top-p and the seeded draw): its own context bookkeeping, its
own stop rule, its own keep rule (read from the message's explicit ``keep_sampled``, checked
against the message's length), its own bad-word masking and its own TensorRT-LLM logit processing
(bias, penalties over the whole context, min_tokens; written out token by token), so a mistake in
any of the runtime's copies shows up as a difference. Give it a policy object of its own
(``create_policy``), not the runtime's.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import torch

from ..engine.base import SamplingParams, StepResult
from ..engine.sampling import sample_tokens, sampled_log_prob
from ..protocol import Policy, RequestSpec, RequestView, as_route


class FullRecompute(Protocol):
    """Next-token logits [V] and final hidden state [H] for a whole context, computed from scratch."""

    def __call__(self, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]: ...


def hf_full_recompute(model: torch.nn.Module) -> FullRecompute:
    """A transformers causal LM as a full-recompute function (no cache)."""

    @torch.inference_mode()
    def forward(tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        output = model(torch.tensor([tokens]), use_cache=False, output_hidden_states=True)
        return output.logits[0, -1].float(), output.hidden_states[-1][0, -1]

    return forward


def stop_reason(context: Sequence[int], prompt_len: int, spec: RequestSpec, max_model_len: int) -> str | None:
    """Why decoding ends after the last token of ``context``: an end id, a stop sequence at the
    end, ``max_tokens`` generated, or the context limit reached."""
    output = list(context[prompt_len:])
    if output and output[-1] in spec.end_ids:
        return "eos"
    if any(stop and output[len(output) - len(stop):] == list(stop) for stop in spec.stop_sequences
           if len(output) >= len(stop)):
        return "stop"
    if len(output) == spec.max_tokens or len(context) == max_model_len:
        return "length"
    return None


def reference_generate(models: dict[str, FullRecompute], policy: Policy, entry: str,
                       prompt_ids: Sequence[int], spec: RequestSpec, *, max_model_len: int,
                       rid: str = "ref", log_probs: list[float] | None = None) -> tuple[list[int], list[int], str]:
    """Routed decoding of one prompt; returns (output tokens, producing model index per token, finish reason).
    ``log_probs``, when given and the spec asks for them, receives each output token's log
    probability at the model that sampled it."""
    names = list(models)
    prompt_len = len(prompt_ids)
    context: list[int] = list(prompt_ids)  # the committed context
    origins: list[int] = []  # producing model per output token
    logprobs: list[float] = []  # per output token, when the spec returns them
    state: dict = {}  # the policy's state; it travels with the request
    # per model: how much of the context each peer has seen
    known: dict[str, dict[str, int]] = {name: {} for name in names}
    holder = entry
    sampling = SamplingParams(spec.temperature, spec.top_p, spec.top_k, spec.seed)

    def view(model: str, sampled: int | None, tokens: Sequence[int],
             sampled_logprob: float | None = None) -> RequestView:
        output = max(len(tokens) - prompt_len, 0)
        return RequestView(rid=rid, model=model, model_index=names.index(model), token_ids=list(tokens),
                           prompt_len=prompt_len, origins=origins[:output], spec=spec, state=state,
                           known=known[model], sampled_token=sampled, logprobs=logprobs[:output],
                           sampled_logprob=sampled_logprob)

    def commit(token: int, logprob: float | None) -> str | None:
        context.append(token)
        origins.append(names.index(holder))
        if logprob is not None:  # (present exactly when the spec returns them)
            logprobs.append(logprob)
        return stop_reason(context, prompt_len, spec, max_model_len)

    def done(reason: str) -> tuple[list[int], list[int], str]:
        if log_probs is not None:
            log_probs[:] = logprobs
        return context[prompt_len:], origins, reason

    while True:
        out = _one_step(models[holder], policy, context, prompt_len, spec, sampling)
        sampled = int(out.sampled[0])
        decision = as_route(policy.route([view(holder, sampled, context)], out)[0])
        if decision.state is not None:
            state = dict(decision.state)
        token = sampled if decision.token is None else int(decision.token)
        logprob = sampled_log_prob(out.require_logits()[0], sampling, token) if spec.return_log_probs else None
        if decision.destination == holder:
            if (reason := commit(token, logprob)) is not None:
                return done(reason)
            continue
        message = policy.send(view(holder, token, context, logprob), decision.destination)
        kept = len(context) + 1 if message.keep_sampled else len(context)
        if message.anchor + len(message.tokens) != kept:
            raise AssertionError(f"the handoff ends at {message.anchor + len(message.tokens)}, the context at {kept}")
        if message.keep_sampled and (reason := commit(token, logprob)) is not None:
            return done(reason)
        receiver = decision.destination
        known[holder][receiver] = len(context)
        tokens = list(policy.receive(view(receiver, None, context[:message.anchor]), message))
        del context[message.anchor:]
        del origins[max(message.anchor - prompt_len, 0):]
        del logprobs[max(message.anchor - prompt_len, 0):]
        for position, token_id in enumerate(tokens, start=message.anchor):
            context.append(token_id)
            if position >= prompt_len:
                origins.append(message.origins[position - message.anchor])
                if spec.return_log_probs:
                    carried = message.logprobs[position - message.anchor]
                    if carried is None:  # None marks prompt positions only
                        raise AssertionError(f"the handoff has no log probability at output position {position}")
                    logprobs.append(carried)
        known[receiver][holder] = message.anchor + len(message.tokens)
        state = dict(message.state)
        holder = receiver


def _one_step(forward: FullRecompute, policy: Policy, context: list[int], prompt_len: int, spec: RequestSpec,
              sampling: SamplingParams) -> StepResult:
    logits, hidden = forward(context)
    logits = _processed(logits.float(), context, prompt_len, spec)[None]
    position = len(context)
    result = StepResult(seq_ids=["ref"], sampled=sample_tokens(logits, [sampling], [position]), logits=logits,
                        positions=torch.tensor([position]), hidden=hidden[None] if policy.needs_hidden else None)
    if policy.top_logits:  # like the engine: top-k of the processed logits, before constraints
        top = torch.topk(logits, policy.top_logits, dim=-1)
        result.topk_values, result.topk_indices = top.values, top.indices
    # Bad words: the last token of each whose other tokens end the context is masked; a sampled
    # token that is masked is drawn again from the masked logits (same seed and position).
    banned = [bad[-1] for bad in spec.bad_sequences if bad and context[len(context) - len(bad) + 1:] == list(bad[:-1])]
    if banned:
        result.logits = logits.clone()
        result.logits[0, banned] = float("-inf")
        if int(result.sampled[0]) in banned:
            result.sampled = sample_tokens(result.logits, [sampling], [position])
    return result


def _processed(logits: torch.Tensor, context: list[int], prompt_len: int, spec: RequestSpec) -> torch.Tensor:
    """TensorRT-LLM's processing of next-token logits [V], one token at a time in float32: bias,
    then the penalties for every token of the context (prompt and output, whoever produced it),
    then min_tokens. The subtracted penalties are scaled by the temperature (1 when greedy)
    because the sampler divides by it afterwards."""
    def f32(value: float) -> torch.Tensor:
        return torch.tensor(value, dtype=torch.float32)

    logits = logits.clone()
    bias: dict[int, float] = {}
    for token, weight in spec.logit_bias:
        bias[int(token)] = bias.get(int(token), 0.0) + float(weight)
    for token, weight in bias.items():
        logits[token] = logits[token] + f32(weight)
    if (spec.repetition_penalty, spec.presence_penalty, spec.frequency_penalty) != (1.0, 0.0, 0.0):
        scale = f32(spec.temperature if spec.temperature > 0 else 1.0)
        occurrences: dict[int, int] = {}
        for token in context:
            occurrences[token] = occurrences.get(token, 0) + 1
        for token, count in occurrences.items():
            value = logits[token]
            value = value * f32(spec.repetition_penalty) if value < 0 else value / f32(spec.repetition_penalty)
            logits[token] = value - scale * (f32(spec.presence_penalty) + f32(spec.frequency_penalty) * f32(count))
    if len(context) - prompt_len < spec.min_tokens:
        for token in spec.end_ids:
            logits[token] = float("-inf")
    return logits

