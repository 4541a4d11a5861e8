"""The handoff protocol: what a holder sends when a request leaves or progresses, what a receiver
does with a handoff, and the checks that let a receiver drop a message that does not fit.

Ownership is exclusive: exactly one model holds a request (``here``); the others keep its KV and
an *anchor* per peer (``known``: how much of the context that peer has seen), so every message
carries only the suffix after the receiver's anchor.
"""

from __future__ import annotations

from ..protocol import MessageKind, PeerMessage
from .request import RequestState


def stamp_handoff(request: RequestState, message: PeerMessage, *, sender: str, peer: str, active: int) -> None:
    """Make the policy's message a handoff from ``sender`` and record that the request left."""
    message.kind, message.sender, message.active = "handoff", sender, active
    request.known[peer] = message.end
    request.here = False
    request.sent_to = peer
    request.sampled_token = request.sampled_logprob = None


def suffix_message(request: RequestState, peer: str, kind: MessageKind, *, sender: str, reason: str | None = None,
                   error: str | None = None) -> PeerMessage:
    """A ``progress`` or ``ended`` message: the context ``peer`` has not seen yet."""
    anchor = request.known.get(peer, 0)
    origins = [-1] * request.prompt_len + request.origins
    logprobs = [None] * request.prompt_len + request.logprobs if request.spec.return_log_probs else []
    request.known[peer] = len(request.token_ids)
    return PeerMessage(kind=kind, rid=request.rid, sender=sender, anchor=anchor, tokens=request.token_ids[anchor:],
                       origins=origins[anchor:], finish_reason=reason, state={"error": error} if error else {},
                       logprobs=logprobs[anchor:])


def suffix_problem(request: RequestState | None, message: PeerMessage) -> str | None:
    """Why a handoff/progress/ended message cannot apply to ``request`` (None: it can)."""
    if len(message.origins) < len(message.tokens):
        return "fewer origins than tokens"
    if request is None:
        return "unknown request"
    if message.anchor < 0 or message.anchor > len(request.token_ids):
        return "anchor past the known context"
    computed = request.token_ids[message.anchor:request.cached]
    if message.tokens[:len(computed)] != computed:
        return "rewrites context this model already computed"
    return None


def handoff_problem(request: RequestState | None, message: PeerMessage, *, first_visit_allowed: bool) -> str | None:
    """Why this handoff cannot be taken (None: it can). A first visit carries the request's spec
    (so does any handoff from a sender that has not heard from this model: anchor 0)."""
    if request is not None and request.here:
        return "duplicate first visit" if message.request is not None else "handoff for a request held here"
    if request is None and message.request is not None:
        if not first_visit_allowed:
            return "first visit to the entry"
        if message.anchor != 0 or len(message.origins) < len(message.tokens):
            return "first visit with a bad anchor"
        return None
    return suffix_problem(request, message)


def accept_handoff(request: RequestState, message: PeerMessage, tokens: list[int], now: float) -> int:
    """Take the request: apply the committed ``tokens`` (the policy's choice of ``message.tokens``)
    and make it runnable here. Returns how many tokens the context grew by."""
    grown = request.apply_suffix(message.anchor, tokens, message.origins[:len(tokens)],
                                 message.logprobs[:len(tokens)])
    request.state = dict(message.state)
    request.known[message.sender] = message.end
    request.here = True
    request.ready_since = now
    return grown
