"""What differs between the entry model and a peer, as two small roles of the subserver core.

The entry owns the client side: validation and admission, streaming to the client's sink, ending
a request (finished, cancelled or failed), the global active count, and telling every peer to
release a request. A peer only decodes what it is handed; it reports its commits and the end of a
request it holds to the entry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..protocol import PeerMessage, RequestSpec
from .admission import Admission, ServerBusy
from .effects import Effect, Emit, Send
from .emission import ClientOutputs
from .handoff import suffix_message, suffix_problem
from .request import RequestState, Submission, no_tokens_logprobs, validate_submission

if TYPE_CHECKING:
    from .core import SubserverCore


class EntryRole:
    takes_first_visits = False  # requests start here by admission, never by a handoff

    def __init__(self, core: "SubserverCore", capacities: dict[str, tuple[int, int]]) -> None:
        self.core = core
        self.admission = Admission(capacities, core.limits)
        self.outputs = ClientOutputs(core.stats.output_by_model)

    def validate(self, prompt_ids: list[int], spec: RequestSpec, vocab_size: int) -> None:
        validate_submission(prompt_ids, spec, max_model_len=self.core.limits.max_model_len, vocab_size=vocab_size)
        self.admission.check_fits(len(prompt_ids), spec.max_tokens)

    def check_room(self, in_transit: int) -> None:
        try:
            self.admission.check_room(in_transit)
        except ServerBusy:
            self.core.stats.refused_busy += 1
            raise

    def queued(self) -> int:
        return len(self.admission.waiting)

    def submit(self, submission: Submission) -> list[Effect]:
        self.admission.waiting.append(submission)
        return []

    def can_admit(self) -> bool:
        return self.admission.can_admit(self.core.active)

    def admit(self) -> list[Effect]:
        core = self.core
        fx: list[Effect] = [self._time_out(s) for s in self.admission.expire(core.now)]
        while (submission := self.admission.admit_next(core.active)) is not None:
            waited = max(0.0, core.now - submission.submitted_at)
            core.stats.queue_wait_s += waited
            core.stats.queue_waits.append(waited)
            prompt = list(submission.prompt_ids)
            core.make_runnable(RequestState(rid=submission.rid, model=core.name, model_index=core.index,
                                            token_ids=prompt, prompt_len=len(prompt), origins=[],
                                            spec=submission.spec, here=True, ready_since=core.now))
            self.outputs.open(submission.rid, submission.sink)
            core.active += 1
            self._broadcast_active(fx)
        return fx

    def _time_out(self, submission: Submission) -> Effect:
        """A submission that waited ``queue_timeout_s`` without being admitted ends here; it holds
        no KV and no slot yet, so answering its client frees everything it had."""
        stats, timeout = self.core.stats, self.core.limits.queue_timeout_s
        stats.queue_timeouts += 1
        stats.finished["error"] += 1
        return Emit(submission.rid, submission.sink, [], [], "error",
                    f"server busy: not admitted within queue_timeout_s ({timeout:g} s); retry later",
                    no_tokens_logprobs(submission.spec))

    def cancel(self, rid: str) -> list[Effect]:
        fx: list[Effect] = []
        waiting = self.admission.withdraw(rid)
        if waiting is not None:
            self.core.stats.finished["cancelled"] += 1
            return [Emit(rid, waiting.sink, [], [], "cancelled", logprobs=no_tokens_logprobs(waiting.spec))]
        if rid in self.core.requests:
            self._end(rid, "cancelled", None, False, fx)
        return fx  # unknown or already over: nothing to do

    def on_commit(self, request: RequestState, tokens: list[int], origins: list[int], reason: str | None,
                  inform_entry: bool, fx: list[Effect]) -> None:
        fx += self.outputs.emit(request.rid, tokens, origins, reason, logprobs=request.client_logprobs(len(tokens)))

    def on_grown(self, request: RequestState, grown: int, reason: str | None, error: str | None,
                 fx: list[Effect]) -> None:
        """A peer's newer context arrived: stream what is new (with the finish, if any)."""
        if grown > 0 or reason is not None:
            new = max(grown, 0)
            fx += self.outputs.emit(request.rid, request.token_ids[len(request.token_ids) - new:],
                                    request.origins[len(request.origins) - new:], reason, error,
                                    logprobs=request.client_logprobs(new))

    def end(self, request: RequestState, reason: str, error: str | None, notified: bool,
            fx: list[Effect]) -> None:
        """It finished or failed here (``reason`` "error": failed)."""
        self._end(request.rid, reason, error, notified, fx)

    def _end(self, rid: str, reason: str, error: str | None, notified: bool, fx: list[Effect]) -> None:
        """The request is over (finished, cancelled or failed): tell the client (unless its last
        output already said so), release it on every model, let the next one in."""
        core = self.core
        if not notified:
            fx += self.outputs.emit(rid, [], [], reason, error, logprobs=no_tokens_logprobs(core.requests[rid].spec))
        self.outputs.close(rid)
        core.stats.finished[reason] += 1
        core.release(rid, fx)
        # Every peer, not only those this model handed to: a request may travel peer to peer.
        fx += [Send(peer, PeerMessage(kind="release", rid=rid, sender=core.name)) for peer in core.peers]
        self.admission.release(rid)
        core.active -= 1
        self._broadcast_active(fx)

    def _broadcast_active(self, fx: list[Effect]) -> None:
        core = self.core
        fx += [Send(peer, PeerMessage(kind="active", rid="", sender=core.name, active=core.active))
               for peer in core.peers]

    def on_active(self, active: int) -> None:
        """The entry counts N itself; a peer's echo of it is ignored."""

    def on_release(self, message: PeerMessage, fx: list[Effect]) -> None:
        self.core.drop_message(message, "release sent to the entry")

    def on_suffix(self, message: PeerMessage, fx: list[Effect]) -> None:
        """A peer's progress (tokens it committed) or the end of a request it holds."""
        core = self.core
        request = core.requests.get(message.rid)
        problem = suffix_problem(request, message)  # (never None for an unknown request)
        if request is None or problem is not None:
            return core.drop_message(message, problem or "unknown request")
        if request.here:
            return core.drop_message(message, f"{message.kind} for a request held here")
        reason = (message.finish_reason or "error") if message.kind == "ended" else None
        grown = request.apply_suffix(message.anchor, message.tokens, message.origins[:len(message.tokens)],
                                     message.logprobs)
        request.known[message.sender] = message.end
        self.on_grown(request, grown, reason, message.state.get("error"), fx)
        if reason is not None:
            self._end(request.rid, reason, None, True, fx)
        return None

    def on_peer_lost(self, peer: str, error: str, fx: list[Effect]) -> None:
        """The requests away at ``peer`` end with ``error`` (the client hears it) and are released
        everywhere else; those here go on (a handoff to ``peer`` fails when it is sent)."""
        for request in self.core.away_at(peer):
            self._end(request.rid, "error", error, False, fx)

    def shutdown(self, reason: str) -> list[Effect]:
        fx: list[Effect] = [Emit(s.rid, s.sink, [], [], "error", reason, no_tokens_logprobs(s.spec))
                            for s in self.admission.drain()]
        for rid in list(self.core.requests):
            self._end(rid, "error", reason, False, fx)
        return fx


class PeerRole:
    takes_first_visits = True  # a request first arrives here by a handoff carrying its spec

    def __init__(self, core: "SubserverCore") -> None:
        self.core = core

    def validate(self, prompt_ids: list[int], spec: RequestSpec, vocab_size: int) -> None:
        raise self._not_entry()

    def submit(self, submission: Submission) -> list[Effect]:
        raise self._not_entry()

    def _not_entry(self) -> RuntimeError:
        return RuntimeError(f"'{self.core.name}' is not the entry model ('{self.core.entry}' is)")

    def check_room(self, in_transit: int) -> None:
        raise self._not_entry()

    def queued(self) -> int:
        return 0

    def can_admit(self) -> bool:
        return False

    def admit(self) -> list[Effect]:
        return []

    def cancel(self, rid: str) -> list[Effect]:
        return []  # only the entry cancels; the peer hears "release"

    def on_commit(self, request: RequestState, tokens: list[int], origins: list[int], reason: str | None,
                  inform_entry: bool, fx: list[Effect]) -> None:
        # Keep the entry informed so the client sees tokens while the request stays away; a
        # handoff carries its own tokens (inform_entry=False), an ended message its last ones.
        if reason is None and inform_entry:
            progress = suffix_message(request, self.core.entry, "progress", sender=self.core.name)
            fx.append(Send(self.core.entry, progress))

    def on_grown(self, request: RequestState, grown: int, reason: str | None, error: str | None,
                 fx: list[Effect]) -> None:
        """Nothing to stream: only the entry talks to the client."""

    def end(self, request: RequestState, reason: str, error: str | None, notified: bool,
            fx: list[Effect]) -> None:
        """It finished or failed here: report it to the entry (an "ended" message with the reason,
        "error" included; the entry ends it everywhere) and release it here."""
        core = self.core
        fx.append(Send(core.entry, suffix_message(request, core.entry, "ended", sender=core.name, reason=reason,
                                                  error=error)))
        core.release(request.rid, fx)

    def on_active(self, active: int) -> None:
        self.core.active = active

    def on_release(self, message: PeerMessage, fx: list[Effect]) -> None:
        core = self.core
        if message.sender != core.entry:
            return core.drop_message(message, "release from a model that is not the entry")
        if message.rid not in core.requests:
            core.stats.dropped_messages["release for a request never held"] += 1
            core.tombstones[message.rid] = core.now  # a handoff still on its way is late, too
            return None
        core.release(message.rid, fx)
        return None

    def on_suffix(self, message: PeerMessage, fx: list[Effect]) -> None:
        self.core.drop_message(message, f"{message.kind} sent to a peer")

    def on_peer_lost(self, peer: str, error: str, fx: list[Effect]) -> None:
        """Without the entry no request here can reach its client: all are released (the entry ends
        them on its side). Without another peer, the requests away at it end as any failure here."""
        core = self.core
        if peer == core.entry:
            for rid in list(core.requests):
                core.release(rid, fx)
            core.active = 0  # the entry counts N, and tells it again when it is back
            return
        for request in core.away_at(peer):
            self.end(request, "error", error, False, fx)

    def shutdown(self, reason: str) -> list[Effect]:
        return []
