"""Asking the policy where each finished row of a step goes, with per-request fault isolation."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ..engine.base import StepResult
from ..engine.sampling import sampled_log_prob
from ..protocol import Policy, Route, as_route
from .request import RequestState

log = logging.getLogger(__name__)


def route_rows(policy: Policy, requests: list[RequestState],
               out: StepResult) -> tuple[Sequence[Route | None], dict[str, str]]:
    """One decision per row, and {rid: error} for the rows the policy failed on (their decision is
    None). When the policy raises on the batch it is asked row by row, so only the requests it
    fails on end."""
    try:
        return decide(policy, requests, out), {}
    except Exception:
        log.exception("policy %s failed on a batch of %d", policy.name, len(requests))
    decisions: list[Route | None] = []
    failures: dict[str, str] = {}
    for row, request in enumerate(requests):
        try:
            decisions += decide(policy, [request], select_result_rows(out, [row]))
        except Exception as exc:
            decisions.append(None)
            failures[request.rid] = f"policy '{policy.name}' failed: {type(exc).__name__}: {exc}"
    return decisions, failures


def decide(policy: Policy, requests: list[RequestState], out: StepResult) -> list[Route]:
    decisions = [as_route(d) for d in policy.route([r.view() for r in requests], out)]
    if len(decisions) != len(requests):
        raise ValueError(f"route returned {len(decisions)} decisions for {len(requests)} rows")
    return decisions


def record_log_probs(requests: list[RequestState], decisions: Sequence[Route | None], out: StepResult) -> None:
    """For each request that returns log probabilities, the one of the token its decision keeps
    (the sampled token, or the policy's replacement), in the distribution this model drew from."""
    for row, (request, decision) in enumerate(zip(requests, decisions)):
        if decision is not None and request.spec.return_log_probs:
            token = request.sampled_token if decision.token is None else int(decision.token)
            if token is None:  # the step's sampled tokens are set on its requests before routing
                raise ValueError(f"request {request.rid}: no sampled token to score")
            # Greedy rows report 0.0 without the logits (a step may leave them out, engine.base).
            logits = None if request.sampling.greedy else out.require_logits()[row]
            request.sampled_logprob = sampled_log_prob(logits, request.sampling, token)


def select_result_rows(result: StepResult, rows: list[int]) -> StepResult:
    def pick(tensor):
        return None if tensor is None else tensor[rows]

    return StepResult(seq_ids=[result.seq_ids[i] for i in rows], sampled=result.sampled[rows].clone(),
                      logits=pick(result.logits), positions=pick(result.positions), hidden=pick(result.hidden),
                      topk_values=pick(result.topk_values), topk_indices=pick(result.topk_indices))
