"""Query-level routing: the whole request goes to one model, chosen once after the prompt.

The choice is made on the entry (small) model's first step, from the prompt alone, and kept in
the request's state; no later step ever switches models. When the large model is chosen, the
small model's first token is dropped so the large model writes the entire response.

modes:
  length      the large model when the prompt has at least ``min_prompt_tokens`` tokens
  entropy     the large model when the small model's first-token normalized entropy > ``threshold``
  classifier  a prompt classifier: a hidden-state head trained by ``tokenrouter train-router``
              (``classifier``: which head, citer or co_llm; from ``weights``) on the small
              model's hidden state at the end of the prompt; large when p >= ``threshold``
"""

from __future__ import annotations

from typing import Literal, Sequence

import torch

from ..protocol import PeerMessage, Route
from .base import PolicyParams, RequestView, RoutingPolicy, StepResult, register_policy
from .deferral import row_hidden
from .networks import load_router
from .r_stitch import row_entropy



class QueryLevelParams(PolicyParams):
    mode: Literal["length", "entropy", "classifier"] = "entropy"
    threshold: float | None = None  # None: 0.1 for entropy, the head's trained threshold for classifier
    min_prompt_tokens: int = 256
    classifier: Literal["citer", "co_llm"] = "citer"  # heads that read the hidden state alone


@register_policy
class QueryLevel(RoutingPolicy):
    """params: mode (entropy), threshold (0.1 for entropy; the head's trained threshold for
    classifier), min_prompt_tokens (256), classifier (citer)."""

    name = "query_level"
    Params = QueryLevelParams

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.mode = self.params.mode
        self.min_prompt_tokens = self.params.min_prompt_tokens
        self.router = None
        if self.mode == "classifier":
            self.router = load_router(self.weights, self.params.classifier)
            self.needs_hidden = True
        default = self.router.threshold if self.router else 0.1
        self.threshold = default if self.params.threshold is None else self.params.threshold

    @torch.inference_mode()
    def wants_large(self, request: RequestView, out: StepResult, row: int) -> bool:
        if self.mode == "length":
            return request.prompt_len >= self.min_prompt_tokens
        if self.mode == "entropy":
            return row_entropy(out, row) > self.threshold
        router = self.router
        assert router is not None, "mode 'classifier' loaded it in __init__"
        logit = router.network(row_hidden(self, out, row, router.hidden_size))
        return float(torch.sigmoid(logit)[0]) >= self.threshold

    def route(self, batch: Sequence[RequestView], out: StepResult) -> list[str | Route]:
        decisions: list[str | Route] = []
        for row, request in enumerate(batch):
            if "query_model" in request.state:
                decisions.append(request.state["query_model"])
                continue
            chosen = self.large if self.wants_large(request, out, row) else self.small
            decisions.append(Route(chosen, state={"query_model": chosen}))
        return decisions

    def send(self, request: RequestView, peer: str) -> PeerMessage:
        return request.message_to(peer, keep_sampled=False, state=request.state)
