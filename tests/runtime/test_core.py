"""The subserver core driven synchronously: events in, effects out, no thread, engine or clock.

Each test names the scheduling rule it holds (docs/runtime.md lists them with these tests) and
the bug that would make it fail.
"""

from __future__ import annotations

from typing import Sequence


from tokenrouter.protocol import PeerMessage, RequestSpec, Route
from tokenrouter.runtime.admission import ServerBusy
from tokenrouter.runtime.core import SubserverCore
from tokenrouter.runtime.effects import Emit, Release, Routed, Send
from tokenrouter.request_builder import RequestError
from tokenrouter.runtime.request import Submission

import pytest

from helpers.core_driver import VOCAB, Scripted, Sink, core, run, step

def submit(entry: SubserverCore, rid: str, prompt: Sequence[int] = (1, 2, 3), max_tokens: int = 4,
           now: float = 0.0) -> Sink:
    sink = Sink()
    spec = RequestSpec(prompt_len=len(prompt), max_tokens=max_tokens, end_ids=[0])
    entry.validate(list(prompt), spec, VOCAB)
    entry.check_room()
    assert entry.submit(Submission(rid, list(prompt), spec, sink, submitted_at=now), now) == []
    return sink


def sends(effects, kind: str | None = None) -> list[Send]:
    return [e for e in effects if isinstance(e, Send) and (kind is None or e.message.kind == kind)]


def hand_to_peer(peer: SubserverCore, rid: str, prompt: Sequence[int] = (1, 2, 3), now: float = 0.0) -> list:
    spec = RequestSpec(prompt_len=len(prompt), max_tokens=8)
    message = PeerMessage(kind="handoff", rid=rid, sender="a", anchor=0, tokens=list(prompt),
                          origins=[-1] * len(prompt), request=spec, active=None)
    return peer.on_message(message, now)


# --- delayed batching ------------------------------------------------------------------------------------
def test_delayed_batching_waits_for_b_ready_rows_then_runs_them_together():
    """Rule: a model steps only once min(B(N), N) requests are ready. Catches a scheduler that
    starts a step as soon as anything is runnable (delayed batching switched off)."""
    b = core("b", threshold=lambda n: 3)
    b.on_message(PeerMessage(kind="active", rid="", sender="a", active=4), 0.0)
    hand_to_peer(b, "r0", now=0.0)
    hand_to_peer(b, "r1", now=0.1)
    assert b.schedule(0.2) is None  # 2 ready < B = 3, and the oldest waited 0.2 s of 1 s
    assert b.wait_left(0.2) == pytest.approx(0.8)
    hand_to_peer(b, "r2", now=0.3)
    batch = b.schedule(0.3)
    assert batch is not None and batch.rids == ["r0", "r1", "r2"]


def test_threshold_is_capped_by_the_active_count():
    """Rule: with every active request here there is nothing to wait for (B capped at N).
    Catches a threshold that waits for requests that do not exist (stalls until max_wait)."""
    b = core("b", threshold=lambda n: 3)
    b.on_message(PeerMessage(kind="active", rid="", sender="a", active=2), 0.0)
    hand_to_peer(b, "r0")
    hand_to_peer(b, "r1")
    assert b.schedule(0.0).rids == ["r0", "r1"]


def test_starvation_guard_starts_a_short_batch_after_max_wait():
    """Rule: the oldest ready request never waits longer than max_wait. Catches a guard that
    is missing or measured from the wrong request."""
    b = core("b", threshold=lambda n: 3, max_wait_s=0.5)
    b.on_message(PeerMessage(kind="active", rid="", sender="a", active=4), 0.0)
    hand_to_peer(b, "r0", now=0.0)
    hand_to_peer(b, "r1", now=0.4)
    assert b.schedule(0.49) is None
    assert b.schedule(0.5).rids == ["r0", "r1"]


def test_threshold_reads_the_active_count_the_entry_broadcasts():
    """Rule: B is a function of the global N, which only the entry counts. Catches a peer that
    uses its own held count, or an entry that does not broadcast N."""
    seen = []
    a = core("a", threshold=lambda n: seen.append(n) or 1)
    submit(a, "r0")
    submit(a, "r1")
    effects = a.tick(0.0)
    assert [s.message.active for s in sends(effects, "active")] == [1, 2]
    a.schedule(0.0)
    assert seen[-1] == 2


# --- admission -------------------------------------------------------------------------------------------
def test_admission_reserves_kv_on_every_model_and_waits_for_it():
    """Rule: KV for prompt + max_tokens is reserved on every model before a request starts;
    the next waits (FIFO) until a finish frees enough. Catches admission without reservation
    (a routed request could run out of KV on a peer)."""
    a = core(capacities={"a": (100, 4), "b": (6, 4)})  # b holds 24 tokens; each request needs 20
    submit(a, "r0", max_tokens=17)
    submit(a, "r1", max_tokens=17)
    a.tick(0.0)
    assert list(a.requests) == ["r0"] and a.role.admission.reserved == {"a": 5, "b": 5}
    run(a.cancel("r0", 0.1))
    a.tick(0.1)
    assert list(a.requests) == ["r1"] and a.role.admission.reserved == {"a": 5, "b": 5}
    assert a.stats.queue_wait_s == pytest.approx(0.1)


def test_admission_stops_at_max_active():
    """Rule: at most max_active requests are active. Catches an unbounded admission."""
    a = core(max_active=2)
    for i in range(3):
        submit(a, f"r{i}")
    a.tick(0.0)
    assert list(a.requests) == ["r0", "r1"] and a.active == 2


def test_a_request_larger_than_a_pool_is_refused_at_submit():
    """Rule: a request that could never be admitted fails at once, naming the model. Catches a
    request that would wait in the queue forever."""
    a = core(capacities={"a": (100, 4), "b": (2, 4)}, max_model_len=64)
    with pytest.raises(RequestError, match="model 'b' holds 8"):
        submit(a, "r0", max_tokens=10)


def test_a_full_queue_refuses_the_next_request_at_once_and_counts_it():
    """Rule: at most max_queue requests wait for admission (active ones do not count); one more is
    refused at submit with 'server busy', and a place that frees up is taken again. Catches an
    unbounded queue, a bound that counts active requests, and a refusal that is not counted."""
    a = core(max_active=1, max_queue=2)
    submit(a, "r0")
    a.tick(0.0)  # r0 active; the queue is empty again
    submit(a, "r1")
    submit(a, "r2")
    with pytest.raises(ServerBusy, match=r"server busy: 2 requests queued \(max_queue 2\)"):
        submit(a, "r3")
    assert a.queued == 2 and a.stats.refused_busy == 1 and list(a.requests) == ["r0"]
    run(a.cancel("r1", 0.0))
    submit(a, "r3")
    with pytest.raises(ServerBusy):
        a.check_room(in_transit=0)
    assert a.stats.refused_busy == 2


def test_submissions_not_yet_queued_count_against_the_bound():
    """Rule: the loop's caller counts what it accepted but has not handed to the core yet.
    Catches a bound that only the core's queue sees (a burst would overshoot it)."""
    a = core(max_active=1, max_queue=3)
    submit(a, "r0")  # queued: not admitted before a tick
    a.check_room(in_transit=1)
    with pytest.raises(ServerBusy, match="3 requests queued"):
        a.check_room(in_transit=2)


def test_a_request_waiting_past_the_queue_timeout_ends_with_an_error_and_holds_nothing():
    """Rule: a request not admitted within queue_timeout_s ends with a 'server busy' error; it
    held no KV or slot, so nothing is released and the next one is still admitted. Catches a
    request that waits forever, and a timeout that also hits admitted requests."""
    a = core(max_active=1, queue_timeout_s=5.0)
    running = submit(a, "r0", max_tokens=10)
    a.tick(0.0)
    late = submit(a, "r1", now=1.0)
    later = submit(a, "r2", now=3.0)
    assert run(a.tick(6.0)) == [] and late.finish is None
    effects = run(a.tick(6.5))
    assert late.finish == "error" and "queue_timeout_s (5 s)" in late.error and "server busy" in late.error
    assert [type(e) for e in effects] == [Emit] and a.queued == 1 and a.stats.queue_timeouts == 1
    assert running.finish is None and list(a.requests) == ["r0"]  # the active one runs on
    assert a.role.admission.reserved == {"a": 4, "b": 4}  # only r0's KV
    run(a.cancel("r0", 7.0))
    a.tick(7.0)
    assert list(a.requests) == ["r2"] and later.finish is None


def fit_first_core(max_bypass: int) -> SubserverCore:
    """b's pool holds 10 blocks of 4; r0 (20 tokens, 5 blocks) runs; the head r1 needs 8 blocks
    and does not fit; r2 and r3 behind it need 2 each and fit."""
    a = core(capacities={"a": (100, 4), "b": (10, 4)}, max_bypass=max_bypass)
    submit(a, "r0", max_tokens=17)
    a.tick(0.0)
    submit(a, "r1", max_tokens=29)
    submit(a, "r2", max_tokens=5)
    submit(a, "r3", max_tokens=5)
    a.tick(0.0)
    return a


def test_a_request_that_fits_goes_ahead_of_a_head_that_does_not():
    """Rule: fit-first admission: short requests whose KV fits start while a long head waits for
    KV. Catches a FIFO head blocking everything behind it (the issue's probe)."""
    a = fit_first_core(max_bypass=8)
    assert list(a.requests) == ["r0", "r2", "r3"] and [s.rid for s in a.role.admission.waiting] == ["r1"]
    assert a.role.admission.waiting[0].bypassed == 2


def test_a_head_passed_max_bypass_times_gets_the_next_free_kv():
    """Rule: no starvation: once max_bypass later requests started ahead of a waiting one, nothing
    passes it any more, and the KV freed next goes to it. Catches fit-first without a bound (a
    stream of short requests would keep a long one waiting forever); max_bypass 0 is strict FIFO."""
    a = fit_first_core(max_bypass=1)
    assert list(a.requests) == ["r0", "r2"] and [s.rid for s in a.role.admission.waiting] == ["r1", "r3"]
    run(a.cancel("r0", 0.1))  # frees 5 blocks: r1 (8) fits with r2 (2); r3 does not fit after it
    a.tick(0.1)
    assert list(a.requests) == ["r2", "r1"] and [s.rid for s in a.role.admission.waiting] == ["r3"]
    fifo = fit_first_core(max_bypass=0)
    assert list(fifo.requests) == ["r0"] and fifo.queued == 3


# --- chunked prefill budget ----------------------------------------------------------------------------
def test_prefill_rows_share_the_token_budget_and_long_prompts_are_chunked():
    """Rule: prefill/extend rows share max_prefill_tokens; a row that does not fit whole is chunked,
    decode rows cost nothing, and only a row whose whole input went in predicts a token. Catches a
    budget that is ignored, or a chunk routed as if it had predicted a token."""
    a = core(max_prefill_tokens=8)
    submit(a, "r0", prompt=[1] * 5)
    submit(a, "r1", prompt=[2] * 6)
    submit(a, "r2", prompt=[3] * 20)
    a.tick(0.0)
    batch = a.schedule(0.0)
    assert [(row.seq_id, len(row.new_tokens)) for row in batch.rows] == [("r0", 5), ("r1", 3)]
    effects = step(a, batch, [7, 7])
    routed = [e for e in effects if isinstance(e, Routed)][0]
    assert routed.committed == [1]  # r1 fed a chunk only: nothing sampled for it
    batch = a.schedule(0.0)
    assert [(row.seq_id, len(row.new_tokens)) for row in batch.rows] == [("r0", 1), ("r1", 3), ("r2", 5)]
    assert batch.rows[1].new_tokens == [2, 2, 2]  # the rest of r1's prompt, from where its KV ends


def test_first_prefill_row_progresses_even_when_longer_than_the_budget():
    """Rule: a prompt longer than the budget still advances by one budget per step. Catches a
    scheduler that never starts a long prompt."""
    a = core(max_prefill_tokens=4)
    submit(a, "r0", prompt=list(range(1, 11)))
    a.tick(0.0)
    assert [len(r.new_tokens) for r in a.schedule(0.0).rows] == [4]


def test_max_batch_size_caps_the_rows():
    a = core(max_batch_size=2)
    for i in range(3):
        submit(a, f"r{i}")
    a.tick(0.0)
    assert a.schedule(0.0).rids == ["r0", "r1"]


# --- finishing ------------------------------------------------------------------------------------------
def test_length_finish_after_exactly_max_tokens():
    """Rule: a request ends after exactly max_tokens output tokens. Catches an off-by-one in
    the stop rule (max_tokens + 1 tokens)."""
    a = core()
    sink = submit(a, "r0", max_tokens=3)
    a.tick(0.0)
    for token in (5, 6, 7):
        step(a, a.schedule(0.0), [token])
    assert sink.tokens == [5, 6, 7] and sink.origins == [0, 0, 0] and sink.finish == "length"
    assert a.requests == {} and a.active == 0 and a.schedule(0.0) is None


# --- handoff and resume ---------------------------------------------------------------------------------
def test_handoff_and_resume_bookkeeping_between_two_cores():
    """Rule: a request routed away is pending (KV kept, skipped by the scheduler); the message
    carries only the suffix after the receiver's anchor; on its return it resumes as an extend
    of the returned tokens. Catches a resume that re-feeds the prefix, a wrong anchor, or a
    dropped/kept sampled token on the wrong side."""
    policy = Scripted(keep_sampled=False)
    a, b = core("a", policy=policy), core("b", policy=Scripted(keep_sampled=True))
    sink = submit(a, "r0", prompt=[1, 2, 3], max_tokens=4)
    a.tick(0.0)
    policy.plan[("a", "r0")] = "b"
    effects = step(a, a.schedule(0.0), [9])  # the entry's token 9 is dropped
    (handoff,) = sends(effects, "handoff")
    assert handoff.peer == "b" and handoff.message.tokens == [1, 2, 3] and not handoff.message.keep_sampled
    assert handoff.message.request is not None and a.requests["r0"].here is False and a.schedule(0.0) is None
    run(b.on_message(handoff.message, 0.0))
    batch = b.schedule(0.0)
    assert batch.rows[0].new_tokens == [1, 2, 3]  # first visit: prefill the whole context
    progress = step(b, batch, [4])
    assert [s.message.tokens for s in sends(progress, "progress")] == [[4]]
    run(a.on_message(sends(progress, "progress")[0].message, 0.0))
    assert sink.tokens == [4] and sink.origins == [1]  # streamed while the request stays away
    b.policy.plan[("b", "r0")] = "a"
    back = sends(step(b, b.schedule(0.0), [5]), "handoff")[0].message
    assert back.anchor == 4 and back.tokens == [5] and back.keep_sampled  # kept: committed at b
    run(a.on_message(back, 0.0))
    assert sink.tokens == [4, 5] and sink.origins == [1, 1]
    resume = a.schedule(0.0)
    assert resume.rows[0].new_tokens == [4, 5]  # an extend of what b committed, not a recompute
    assert a.stats.handoffs_out == 1 and b.stats.handoffs_in == 1


def test_a_kept_token_that_ends_the_request_finishes_it_instead_of_handing_off():
    """Rule: a kept sampled token is committed before the handoff and may end the request.
    Catches a handoff of a finished request (one token too many)."""
    policy = Scripted(keep_sampled=True)
    a = core(policy=policy)
    sink = submit(a, "r0", max_tokens=1)
    a.tick(0.0)
    policy.plan[("a", "r0")] = "b"
    effects = step(a, a.schedule(0.0), [9])
    assert sends(effects, "handoff") == [] and sink.tokens == [9] and sink.finish == "length"


# --- cancel in every state ------------------------------------------------------------------------------
def test_cancel_while_queued_answers_the_client_only():
    a = core(max_active=1)
    submit(a, "r0")
    sink = submit(a, "r1")
    a.tick(0.0)
    effects = run(a.cancel("r1", 0.0))
    assert sink.finish == "cancelled" and [type(e) for e in effects] == [Emit] and a.stats.finished["cancelled"] == 1


def test_cancel_while_running_releases_everywhere_and_admits_the_next():
    """Catches a cancel of a running request that is a no-op (it would run to max_tokens)."""
    a = core(max_active=1)
    sink = submit(a, "r0", max_tokens=10)
    submit(a, "r1")
    a.tick(0.0)
    step(a, a.schedule(0.0), [5])
    effects = run(a.cancel("r0", 0.0))
    assert sink.finish == "cancelled" and sink.tokens == [5]
    assert Release("r0") in effects and [s.peer for s in sends(effects, "release")] == ["b"]
    a.tick(0.0)
    assert list(a.requests) == ["r1"] and a.active == 1


def test_cancel_while_away_releases_the_peer_that_holds_it():
    policy = Scripted()
    a, b = core("a", policy=policy), core("b")
    sink = submit(a, "r0", max_tokens=10)
    a.tick(0.0)
    policy.plan[("a", "r0")] = "b"
    run(b.on_message(sends(step(a, a.schedule(0.0), [9]), "handoff")[0].message, 0.0))
    release = sends(run(a.cancel("r0", 0.0)), "release")[0].message
    assert sink.finish == "cancelled"
    assert b.on_message(release, 0.0) == [Release("r0")] and b.requests == {} and b.schedule(0.0) is None


def test_a_lost_peer_ends_the_requests_away_at_it_and_spares_the_others():
    """Rule: when a peer server is lost, the requests it holds end with the error and are released
    here; requests held here go on. Catches a loss that hangs the requests away (their client would
    wait forever), frees the wrong ones, or leaks their KV here."""
    policy = Scripted()
    a = core("a", policy=policy)
    away, stays = submit(a, "r0", max_tokens=10), submit(a, "r1", max_tokens=10)
    a.tick(0.0)
    policy.plan[("a", "r0")] = "b"
    sends(step(a, a.schedule(0.0), [9, 8]), "handoff")
    effects = run(a.peer_lost("b", "model 'b' is unreachable", 0.5))
    assert away.finish == "error" and away.error == "model 'b' is unreachable"
    assert Release("r0") in effects and set(a.requests) == {"r1"} and a.active == 1
    assert stays.finish is None and a.schedule(0.5).rids == ["r1"]
    assert a.peer_lost("b", "again", 0.6) == []  # nothing is away any more


def test_a_peer_that_loses_the_entry_releases_everything_and_one_that_loses_another_peer_reports_to_the_entry():
    """Catches KV held forever on a node whose entry died, and a request away at a lost third model
    that its entry never hears of."""
    policy = Scripted()
    b = SubserverCore("b", ["a", "b", "c"], "a", policy, core().limits)
    for rid in ("r0", "r1"):
        run(b.on_message(PeerMessage(kind="handoff", rid=rid, sender="a", tokens=[1, 2, 3], origins=[-1] * 3,
                                     request=RequestSpec(prompt_len=3, max_tokens=8)), 0.0))
    policy.plan[("b", "r1")] = "c"
    sends(step(b, b.schedule(0.0), [4, 5]), "handoff")
    reported = sends(b.peer_lost("c", "model 'c' is unreachable", 0.1), "ended")
    assert [(s.peer, s.message.rid, s.message.state) for s in reported] == [
        ("a", "r1", {"error": "model 'c' is unreachable"})]
    assert set(b.requests) == {"r0"}
    b.on_message(PeerMessage(kind="active", rid="", sender="a", active=2), 0.1)
    assert b.active == 2
    assert b.peer_lost("a", "the entry is unreachable", 0.2) == [Release("r0")] and b.requests == {}
    assert b.active == 0  # N as the lost entry last told it would hold this model's thresholds forever


# --- a peer instance lost, another of the same model takes its requests ---------------------------------
def away_at_b(a: SubserverCore, b: SubserverCore, policy: Scripted) -> Sink:
    """r0 (prompt 1 2 3) handed to ``b``, which commits 7 there (the entry accepts it as progress)."""
    sink = submit(a, "r0", max_tokens=4)
    a.tick(0.0)
    policy.plan[("a", "r0")] = "b"
    run(b.on_message(sends(step(a, a.schedule(0.0), [9]), "handoff")[0].message, 0.0))
    del policy.plan[("a", "r0")]  # (back at the entry, it stays)
    progress = sends(step(b, b.schedule(0.0), [7]), "progress")[0].message
    run(a.on_message(progress, 0.0))
    assert sink.tokens == [7] and not a.requests["r0"].here
    return sink


def test_a_request_away_at_a_lost_instance_is_sent_whole_to_the_new_one_and_ends_there_as_before():
    """Rule: the entry holds every token, so a request away at a lost instance goes on at another
    instance of the same model: handed off again as a first visit (anchor 0, the whole context with the
    tokens the lost one sent back, the spec); the new instance prefills it and decodes on; the output
    goes on where it was, and KV is released on both sides at the end. Catches a loss that ends the
    request, a re-send from the old anchor (the new instance holds nothing: it would drop it and the
    request would hang), and tokens lost or doubled."""
    policy, back = Scripted(), Scripted(keep_sampled=True)
    a, lost, new = core("a", policy=policy), core("b", policy=back), core("b", policy=back)
    sink = away_at_b(a, lost, policy)
    again = sends(run(a.peer_forgot("r0", "b", 1.0)), "handoff")
    assert [s.peer for s in again] == ["b"]
    message = again[0].message
    assert (message.anchor, message.tokens, message.origins) == (0, [1, 2, 3, 7], [-1, -1, -1, 1])
    assert message.request == a.requests["r0"].spec and sink.finish is None
    run(new.on_message(message, 1.0))
    batch = new.schedule(1.0)
    assert batch.rows[0].new_tokens == [1, 2, 3, 7]  # the whole context, prefilled there
    back.plan[("b", "r0")] = "a"
    returned = sends(step(new, batch, [6]), "handoff")[0].message
    run(a.on_message(returned, 1.0))
    assert sink.tokens == [7, 6] and sink.origins == [1, 1] and a.requests["r0"].here
    effects = step(a, a.schedule(1.0), [5]) + step(a, a.schedule(1.0), [4])
    assert sink.tokens == [7, 6, 5, 4] and sink.finish == "length" and Release("r0") in effects
    assert new.on_message(sends(effects, "release")[0].message, 1.0) == [Release("r0")] and new.requests == {}
    assert a.requests == {} and a.active == 0


def test_a_request_back_at_the_entry_is_not_sent_again_but_its_next_handoff_is_a_first_visit():
    """Rule: a request merely pinned to the lost instance (held by the entry now) stays; what that
    instance had seen is forgotten, so its next handoff carries the whole context to the new instance.
    A cancel then frees it there. Catches a re-send of a request held here (two holders) and a next
    handoff that assumes KV the new instance never had."""
    policy, back = Scripted(), Scripted(keep_sampled=True)
    a, lost, new = core("a", policy=policy), core("b", policy=back), core("b")
    sink = away_at_b(a, lost, policy)
    back.plan[("b", "r0")] = "a"
    run(a.on_message(sends(step(lost, lost.schedule(0.0), [6]), "handoff")[0].message, 0.0))
    assert a.requests["r0"].here and a.requests["r0"].known["b"] == 5
    assert a.peer_forgot("r0", "b", 1.0) == [] and "b" not in a.requests["r0"].known
    policy.plan[("a", "r0")] = "b"
    message = sends(step(a, a.schedule(1.0), [8]), "handoff")[0].message
    assert (message.anchor, message.tokens, message.request) == (0, [1, 2, 3, 7, 6], a.requests["r0"].spec)
    run(new.on_message(message, 1.0))
    assert new.requests["r0"].token_ids == [1, 2, 3, 7, 6] and new.schedule(1.0).rids == ["r0"]
    effects = run(a.cancel("r0", 1.0))
    assert sink.finish == "cancelled" and Release("r0") in effects and a.requests == {}
    assert new.on_message(sends(effects, "release")[0].message, 1.0) == [Release("r0")] and new.requests == {}



def test_a_policy_that_keeps_a_sampled_token_on_a_handoff_sent_again_ends_the_request_alone():
    """A handoff sent again follows no step, so there is no sampled token to keep: a policy message that
    claims one (its last token would be committed as this model's) ends that request with the policy's
    error. Catches a made-up token committed into the context."""

    class KeepsOne(Scripted):
        def send(self, request, peer):
            message = request.message_to(peer, keep_sampled=False)
            message.tokens.append(1)
            message.origins.append(0)
            message.keep_sampled = True
            return message

    policy = Scripted()
    a, lost = core("a", policy=policy), core("b")
    sink = away_at_b(a, lost, policy)
    a.policy = KeepsOne()
    effects = run(a.peer_forgot("r0", "b", 1.0))
    assert sink.finish == "error" and "none was sampled" in sink.error and sink.tokens == [7]
    assert Release("r0") in effects and sends(effects, "handoff") == [] and a.requests == {}

def test_an_instance_lost_after_its_request_ended_changes_nothing():
    policy = Scripted()
    a, lost = core("a", policy=policy), core("b")
    away_at_b(a, lost, policy)
    run(a.cancel("r0", 0.5))
    assert a.peer_forgot("r0", "b", 1.0) == [] and a.requests == {}


def test_cancel_between_schedule_and_step_result_skips_the_row():
    """Catches a step result applied to a request that already ended (a second finish)."""
    a = core()
    sink = submit(a, "r0")
    submit(a, "r1")
    a.tick(0.0)
    batch = a.schedule(0.0)
    run(a.cancel("r0", 0.0))
    effects = step(a, batch, [5, 6])
    assert sink.tokens == [] and sink.finish == "cancelled"
    assert [e.rid for e in effects if isinstance(e, Emit)] == ["r1"]


def test_cancel_after_finish_or_of_an_unknown_request_does_nothing():
    a = core()
    submit(a, "r0", max_tokens=1)
    a.tick(0.0)
    step(a, a.schedule(0.0), [5])
    assert a.cancel("r0", 0.0) == [] and a.cancel("nobody", 0.0) == []
    assert a.stats.finished == {"length": 1}


# --- peer messages are total -----------------------------------------------------------------------------
def test_messages_that_do_not_fit_are_dropped_and_counted_never_raised():
    """Rule: a malformed or out-of-order peer message is dropped and counted; the core goes on.
    Catches a loop that dies (or a request state that breaks) on one bad message."""
    a, b = core("a"), core("b")
    submit(a, "r0")
    a.tick(0.0)
    bad = [
        (a, PeerMessage(kind="progress", rid="ghost", sender="b", anchor=3, tokens=[1], origins=[1])),
        (a, PeerMessage(kind="ended", rid="ghost", sender="b", finish_reason="eos")),
        (a, PeerMessage(kind="progress", rid="r0", sender="b", anchor=3, tokens=[1], origins=[1])),  # held here
        (a, PeerMessage(kind="release", rid="r0", sender="b")),
        (a, PeerMessage(kind="handoff", rid="r0", sender="zz", anchor=3, tokens=[1], origins=[1])),
        (b, PeerMessage(kind="handoff", rid="r9", sender="a", anchor=0, tokens=[1], origins=[-1])),  # no spec
        (b, PeerMessage(kind="ended", rid="r9", sender="a")),
        (b, PeerMessage(kind="release", rid="never", sender="a")),
    ]
    for target, message in bad:
        assert target.on_message(message, 0.0) == []
    hand_to_peer(b, "r1")
    b.schedule(0.0)
    step(b, b.schedule(0.0), [4])  # b holds r1 now, context 4
    assert b.on_message(PeerMessage(kind="handoff", rid="r1", sender="a", anchor=0, tokens=[1, 2, 3], origins=[-1] * 3,
                                    request=RequestSpec(prompt_len=3, max_tokens=8)), 0.0) == []
    assert a.stats.dropped_messages == {"unknown request": 2, "progress for a request held here": 1,
                                        "release sent to the entry": 1, "unknown sender": 1}
    assert b.stats.dropped_messages == {"unknown request": 1, "ended sent to a peer": 1,
                                        "release for a request never held": 1, "duplicate first visit": 1}
    assert list(a.requests) == ["r0"] and a.requests["r0"].here and list(b.requests) == ["r1"]


def test_a_handoff_past_the_known_context_ends_that_request_with_an_error():
    """Rule: a handoff that does not fit a request this model keeps is dropped and the request
    ends with an error (held by no one, it would hang). Catches a hang or a corrupted context."""
    policy = Scripted()
    a = core(policy=policy)
    sink = submit(a, "r0")
    a.tick(0.0)
    policy.plan[("a", "r0")] = "b"
    step(a, a.schedule(0.0), [9])
    past = PeerMessage(kind="handoff", rid="r0", sender="b", anchor=7, tokens=[1], origins=[1])
    effects = run(a.on_message(past, 0.0))
    assert a.stats.dropped_messages == {"anchor past the known context": 1}
    assert sink.finish == "error" and "did not fit" in sink.error and Release("r0") in effects


def test_late_messages_for_a_released_request_are_ignored_until_the_tombstone_expires():
    a = core()
    submit(a, "r0")
    a.tick(0.0)
    run(a.cancel("r0", 0.0))
    late = PeerMessage(kind="progress", rid="r0", sender="b", anchor=3, tokens=[4], origins=[1])
    assert a.on_message(late, 1.0) == [] and a.stats.dropped_messages == {}
    a.tick(1000.0)
    assert "r0" not in a.tombstones


# --- policy failures --------------------------------------------------------------------------------------
def test_a_policy_that_fails_on_one_row_ends_only_that_request():
    policy = Scripted()
    a = core(policy=policy)
    bad, good = submit(a, "r0"), submit(a, "r1")
    a.tick(0.0)
    policy.fail_on = {"r0"}
    step(a, a.schedule(0.0), [5, 6])
    assert bad.finish == "error" and "scripted failure" in bad.error
    assert good.tokens == [6] and good.finish is None


def test_a_policy_handoff_that_skips_context_is_refused():
    """Rule: a handoff must cover the context from the peer's anchor to the end (plus the kept
    token). Catches a policy message that silently loses tokens."""

    class Lossy(Scripted):
        def send(self, request, peer):
            message = super().send(request, peer)
            message.tokens = message.tokens[:-1]
            return message

    policy = Lossy()
    a = core(policy=policy)
    sink = submit(a, "r0")
    a.tick(0.0)
    policy.plan[("a", "r0")] = "b"
    effects = step(a, a.schedule(0.0), [9])
    assert sends(effects, "handoff") == [] and sink.finish == "error" and "failed to send" in sink.error


def test_policies_see_read_only_views():
    """Catches a policy that changes runtime state behind its back (it must return a Route)."""

    class Meddling(Scripted):
        def route(self, batch, out):
            batch[0].token_ids.append(1)
            return super().route(batch, out)

    a = core(policy=Meddling())
    sink = submit(a, "r0")
    a.tick(0.0)
    step(a, a.schedule(0.0), [5])
    assert sink.finish == "error" and a.stats.tokens_committed == 0


def test_route_decisions_set_state_and_replace_the_sampled_token():
    class Replacing(Scripted):
        def route(self, batch, out):
            return [Route(view.model, state={"n": view.state.get("n", 0) + 1}, token=11) for view in batch]

    a = core(policy=Replacing())
    sink = submit(a, "r0")
    a.tick(0.0)
    step(a, a.schedule(0.0), [5])
    step(a, a.schedule(0.0), [5])
    assert sink.tokens == [11, 11] and a.requests["r0"].state == {"n": 2}


def test_shutdown_fails_queued_and_running_requests():
    a = core(max_active=1)
    running, queued = submit(a, "r0"), submit(a, "r1")
    a.tick(0.0)
    run(a.shutdown("the server is shutting down"))
    assert running.finish == queued.finish == "error" and a.requests == {} and a.active == 0


def test_a_step_asks_for_the_logits_only_when_the_policy_or_bad_words_read_them():
    """A policy that reads no logits lets the engine leave them out (a tensor-parallel engine then
    sends back only tokens); a request with bad words still needs them (masked, then resampled)."""
    for needs_logits in (False, True):
        policy = Scripted()
        policy.needs_logits = needs_logits
        entry = core(policy=policy)
        submit(entry, "r0")
        entry.tick(0.0)
        assert entry.schedule(0.0).needs_logits is needs_logits
    entry = core()
    sink = Sink()
    spec = RequestSpec(prompt_len=3, max_tokens=4, end_ids=[0], bad_sequences=[[9]])
    entry.validate([1, 2, 3], spec, VOCAB)
    entry.submit(Submission("r1", [1, 2, 3], spec, sink, submitted_at=0.0), 0.0)
    entry.tick(0.0)
    assert entry.schedule(0.0).needs_logits
