"""Builders for policy tests: request views and step outputs from constructed logits/hidden states."""

from __future__ import annotations

from typing import Sequence

import torch

from tokenrouter.policies.base import RoutingPolicy, StepResult
from tokenrouter.policies.networks import build_network, save_router
from tokenrouter.protocol import PeerMessage, RequestSpec, as_route
from tokenrouter.runtime.request import RequestState

MODELS = ["small", "large"]
VOCAB = 32


def view(model: str = "small", *, tokens: Sequence[int] = (1, 2, 3), prompt_len: int = 3, seed: int = 0,
         temperature: float = 0.0, state: dict | None = None, sampled: int | None = None, rid: str = "r0",
         models: Sequence[str] = MODELS) -> RequestState:
    """A request record as the runtime keeps it; policies get ``.view()`` of it (see ``route``)."""
    generated = len(tokens) - prompt_len
    return RequestState(rid=rid, model=model, model_index=list(models).index(model), token_ids=list(tokens),
                       prompt_len=prompt_len, origins=[0] * generated,
                       spec=RequestSpec(prompt_len=prompt_len, max_tokens=64, temperature=temperature, seed=seed),
                       state=dict(state or {}), sampled_token=sampled)


def peaked(token: int, sharpness: float = 20.0, vocab: int = VOCAB) -> torch.Tensor:
    """Logits [V] with almost all mass on ``token`` (low entropy)."""
    logits = torch.zeros(vocab)
    logits[token] = sharpness
    return logits


def flat(token: int, vocab: int = VOCAB) -> torch.Tensor:
    """Logits [V] close to uniform with a slight preference for ``token`` (high entropy)."""
    logits = torch.zeros(vocab)
    logits[token] = 0.1
    return logits


def route(policy: RoutingPolicy, batch: Sequence[RequestState], out: StepResult) -> list[str]:
    """``policy.route`` on read-only views, its decisions applied to the records the way the
    runtime applies them (state replaced, sampled token replaced); returns the destinations."""
    decisions = [as_route(d) for d in policy.route([r.view() for r in batch], out)]
    assert len(decisions) == len(batch)
    for request, decision in zip(batch, decisions):
        if decision.state is not None:
            request.state = dict(decision.state)
        if decision.token is not None:
            request.sampled_token = decision.token
    return [decision.destination for decision in decisions]


def send(policy: RoutingPolicy, request: RequestState, peer: str) -> PeerMessage:
    return policy.send(request.view(), peer)


def step(batch: Sequence[RequestState], logits: Sequence[torch.Tensor],
         hidden: torch.Tensor | None = None) -> StepResult:
    """A step output whose sampled tokens are the greedy argmax; sets each view's sampled_token."""
    stacked = torch.stack(list(logits)).float()
    sampled = stacked.argmax(dim=-1)
    for request, token in zip(batch, sampled.tolist()):
        request.sampled_token = token
    return StepResult(seq_ids=[r.rid for r in batch], sampled=sampled, logits=stacked,
                      positions=torch.tensor([len(r.token_ids) for r in batch]), hidden=hidden)


def roundtrip(message: PeerMessage) -> PeerMessage:
    """What the peer receives: the message after its JSON trip between processes."""
    return PeerMessage.from_json(message.to_json())


def write_head(directory, algorithm: str, *, hidden_size: int = 8, threshold: float = 0.5, gain: float = 10.0):
    """A hidden-state head whose logit is ``gain * LayerNorm(hidden)[0]``: channel 0 decides."""
    architecture = {"kind": "hidden_head", "hidden_size": hidden_size, "width": 4, "depth": 0}
    network = build_network(architecture)
    with torch.no_grad():
        network.mlp[0].weight.zero_()
        network.mlp[0].weight[0, 0] = gain
        network.mlp[0].bias.zero_()
    return save_router(directory, network, {"algorithm": algorithm, "architecture": architecture,
                                            "threshold": threshold})


def hidden_rows(*signs: float, hidden_size: int = 8) -> torch.Tensor:
    """Hidden states [B, H] whose channel 0 is +5 or -5 (the head above defers on +)."""
    rows = torch.zeros(len(signs), hidden_size)
    rows[:, 0] = 5.0 * torch.tensor(signs)
    return rows
