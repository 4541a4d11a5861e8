"""The naive reference for routed decoding: one request at a time, no batching, no KV cache, each
step recomputed from the whole context, the same policy. The oracle tests hold the served runtime
to token-for-token equality with this.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import torch

from ..engine.base import StepResult
from ..engine.sampling import sample_tokens
from ..policies.base import RequestView, RoutingPolicy
from .constraints import enforce_bad_words
from .messages import RequestSpec
from .request import RequestState


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


def reference_generate(models: dict[str, FullRecompute], policy: RoutingPolicy, entry: str,
                       prompt_ids: Sequence[int], spec: RequestSpec, *, max_model_len: int,
                       rid: str = "ref") -> tuple[list[int], list[int], str]:
    """Routed decoding of one prompt; returns (output tokens, producing model index per token, finish reason)."""
    names = list(models)
    views = {name: RequestState(rid=rid, model=name, model_index=names.index(name), token_ids=[],
                                prompt_len=len(prompt_ids), origins=[], spec=spec) for name in names}
    current = views[entry]
    current.token_ids = list(prompt_ids)
    while True:
        out = _one_step(models[current.model], policy, current)
        current.sampled_token = int(out.sampled[0])
        destination = policy.route([current], out)[0]
        token = current.sampled_token = int(out.sampled[0])  # the policy may have replaced it
        message = None if destination == current.model else policy.send(current, destination)
        if message is None or message.anchor + len(message.tokens) > len(current.token_ids):
            current.commit([token], [current.model_index])
            reason = current.finish_reason(max_model_len)
            if reason:
                return current.token_ids[current.prompt_len:], current.origins, reason
        current.sampled_token = None
        if message is None:
            continue
        current.known[destination] = message.anchor + len(message.tokens)
        receiver = views[destination]
        tokens = policy.receive(receiver, message)
        receiver.apply_suffix(message.anchor, tokens, message.origins[:len(tokens)])
        receiver.state = dict(message.state)
        receiver.known[current.model] = message.anchor + len(message.tokens)
        current = receiver


def _one_step(forward: FullRecompute, policy: RoutingPolicy, view: RequestView) -> StepResult:
    logits, hidden = forward(view.token_ids)
    logits = logits[None].float()
    position = len(view.token_ids)
    result = StepResult(seq_ids=[view.rid], sampled=sample_tokens(logits, [view.sampling], [position]),
                        logits=logits, positions=torch.tensor([position]),
                        hidden=hidden[None] if policy.needs_hidden else None)
    if policy.top_logits:  # like the engine: top-k of the model's own logits, before constraints
        top = torch.topk(logits, policy.top_logits, dim=-1)
        result.topk_values, result.topk_indices = top.values, top.indices
    enforce_bad_words([view], result)
    return result

