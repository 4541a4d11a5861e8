"""The naive reference for routed decoding: one request at a time, no batching, no KV cache, each
step recomputed from the whole context. The oracle tests hold the served runtime to
token-for-token equality with this.

It shares nothing with the runtime but the policy interface (``tokenrouter.protocol``) and the
engine's sampler: its own context bookkeeping, its own stop rule, its own keep rule (read from the
message's explicit ``keep_sampled``, checked against the message's length) and its own bad-word
masking, so a mistake in any of the runtime's copies shows up as a difference. Give it a policy
object of its own (``create_policy``), not the runtime's.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import torch

from ..engine.base import SamplingParams, StepResult
from ..engine.sampling import sample_tokens
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
                       rid: str = "ref") -> tuple[list[int], list[int], str]:
    """Routed decoding of one prompt; returns (output tokens, producing model index per token, finish reason)."""
    names = list(models)
    prompt_len = len(prompt_ids)
    context, origins = list(prompt_ids), []  # the committed context; producing model per output token
    state: dict = {}  # the policy's state; it travels with the request
    known = {name: {} for name in names}  # per model: how much of the context each peer has seen
    holder = entry
    sampling = SamplingParams(spec.temperature, spec.top_p, spec.top_k, spec.seed)

    def view(model: str, sampled: int | None, tokens: Sequence[int]) -> RequestView:
        output = len(tokens) - prompt_len
        return RequestView(rid=rid, model=model, model_index=names.index(model), token_ids=list(tokens),
                           prompt_len=prompt_len, origins=origins[:max(output, 0)], spec=spec, state=state,
                           known=known[model], sampled_token=sampled)

    def commit(token: int) -> str | None:
        context.append(token)
        origins.append(names.index(holder))
        return stop_reason(context, prompt_len, spec, max_model_len)

    while True:
        out = _one_step(models[holder], policy, context, spec, sampling)
        sampled = int(out.sampled[0])
        decision = as_route(policy.route([view(holder, sampled, context)], out)[0])
        if decision.state is not None:
            state = dict(decision.state)
        token = sampled if decision.token is None else int(decision.token)
        if decision.destination == holder:
            if (reason := commit(token)) is not None:
                return context[prompt_len:], origins, reason
            continue
        message = policy.send(view(holder, token, context), decision.destination)
        kept = len(context) + 1 if message.keep_sampled else len(context)
        if message.anchor + len(message.tokens) != kept:
            raise AssertionError(f"the handoff ends at {message.anchor + len(message.tokens)}, the context at {kept}")
        if message.keep_sampled and (reason := commit(token)) is not None:
            return context[prompt_len:], origins, reason
        receiver = decision.destination
        known[holder][receiver] = len(context)
        tokens = list(policy.receive(view(receiver, None, context[:message.anchor]), message))
        del context[message.anchor:]
        del origins[max(message.anchor - prompt_len, 0):]
        for position, (token_id, origin) in enumerate(zip(tokens, message.origins), start=message.anchor):
            context.append(token_id)
            if position >= prompt_len:
                origins.append(origin)
        known[receiver][holder] = message.anchor + len(message.tokens)
        state = dict(message.state)
        holder = receiver


def _one_step(forward: FullRecompute, policy: Policy, context: list[int], spec: RequestSpec,
              sampling: SamplingParams) -> StepResult:
    logits, hidden = forward(context)
    logits = logits[None].float()
    position = len(context)
    result = StepResult(seq_ids=["ref"], sampled=sample_tokens(logits, [sampling], [position]), logits=logits,
                        positions=torch.tensor([position]), hidden=hidden[None] if policy.needs_hidden else None)
    if policy.top_logits:  # like the engine: top-k of the model's own logits, before constraints
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
