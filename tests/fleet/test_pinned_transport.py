"""The entry's transport to a pool of peer instances: placement, pinning for a request's life, and what
a lost or gone instance does to the requests pinned there (links faked: their own protocol is
test_dynamo_channel.py's)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from tokenrouter.fleet.pinned_transport import PinnedTransport
from tokenrouter.protocol import PeerMessage
from tokenrouter.serving.subserver.sending_session import CONNECTING, UP


class FakeLink:
    def __init__(self, on_down: Callable[[str, str], None], state: str = UP) -> None:
        self.on_down = on_down
        self.state = state
        self.sent: list[list[PeerMessage]] = []
        self.closed = False

    @property
    def problem(self) -> str | None:
        return None if self.state == UP else "not connected yet"

    def send(self, messages: Sequence[PeerMessage]) -> None:
        if self.state == CONNECTING:  # what PeerLink does while its session is down
            if any(m.kind == "handoff" for m in messages):
                self.on_down("llm", self.problem or "")
            return
        self.sent.append(list(messages))

    def close(self) -> None:
        self.closed = True

    def rids(self, kind: str) -> list[str]:
        return [m.rid for batch in self.sent for m in batch if m.kind == kind]


def handoff(rid: str) -> PeerMessage:
    return PeerMessage(kind="handoff", rid=rid, sender="slm")


def release(rid: str) -> PeerMessage:
    return PeerMessage(kind="release", rid=rid, sender="slm")


@pytest.fixture
def moved() -> list[tuple[str, str]]:
    """What ``on_moved`` told the entry: (model, rid) of each request that goes on at another instance."""
    return []


Pool = tuple[PinnedTransport, dict[int, FakeLink], list[tuple[str, str]]]


def two_instances(model: str, on_moved: Callable[[str, str], None] | None) -> Pool:
    """A transport with faked links to instances 1 and 2 of ``model``, and the (rid, error) it ended."""
    lost: list[tuple[str, str]] = []
    transport = PinnedTransport(on_lost=lambda rid, error: lost.append((rid, error)), on_moved=on_moved)
    links = {instance: FakeLink(lambda model, error, instance=instance: transport.instance_lost(model, instance, error))
             for instance in (1, 2)}
    for instance, link in links.items():
        transport.add(model, instance, link)  # type: ignore[arg-type]
    return transport, links, lost


@pytest.fixture
def pool(moved) -> Pool:
    """The entry's transport to a peer pool."""
    return two_instances("llm", on_moved=lambda model, rid: moved.append((model, rid)))


def test_new_requests_go_to_the_least_pinned_instance_and_stay_there_for_life(pool):
    transport, links, lost = pool
    transport.send("llm", [handoff("a")])
    transport.send("llm", [handoff("b")])
    transport.send("llm", [handoff("c")])
    assert transport.pinned("llm") == {1: 2, 2: 1}
    transport.send("llm", [handoff("b"), handoff("a")])  # return visits: where the KV is
    transport.send("llm", [release("b")])
    assert links[1].rids("handoff") == ["a", "c", "a"] and links[2].rids("handoff") == ["b", "b"]
    assert links[2].rids("release") == ["b"] and links[1].rids("release") == []
    assert transport.pinned("llm") == {1: 2, 2: 0} and lost == []
    transport.send("llm", [handoff("d")])  # the release made room: the emptier instance takes it
    assert links[2].rids("handoff")[-1] == "d"


def test_a_release_unpins_and_a_release_of_a_request_never_placed_goes_nowhere(pool):
    transport, links, _ = pool
    transport.send("llm", [handoff("a")])
    transport.send("llm", [release("a"), release("never-here")])
    assert transport.pinned("llm") == {1: 0, 2: 0}
    assert [m.rid for link in links.values() for batch in link.sent for m in batch] == ["a", "a"]


def test_messages_about_no_request_reach_every_instance_that_is_up(pool):
    transport, links, _ = pool
    links[3] = FakeLink(lambda model, error: transport.instance_lost(model, 3, error), CONNECTING)
    transport.add("llm", 3, links[3])  # type: ignore[arg-type]
    active = PeerMessage(kind="active", rid="", sender="slm", active=4)
    transport.send("llm", [active])
    assert [len(links[i].sent) for i in (1, 2, 3)] == [1, 1, 0]


def test_an_instance_that_is_not_up_takes_no_new_request(pool):
    transport, links, lost = pool
    links[1].state = CONNECTING
    transport.send("llm", [handoff("a"), handoff("b")])
    assert links[2].rids("handoff") == ["a", "b"] and links[1].sent == [] and lost == []


def test_with_no_instance_up_a_new_request_ends_alone_and_the_rest_of_the_step_goes_out(pool):
    transport, links, lost = pool
    transport.send("llm", [handoff("a")])
    links[1].state = links[2].state = CONNECTING
    transport.send("llm", [handoff("new"), release("a")])
    assert [rid for rid, _ in lost] == ["new"] and "no instance of model 'llm'" in lost[0][1]
    assert transport.pinned("llm") == {1: 0, 2: 0}


def test_a_lost_instance_moves_only_its_own_requests_to_the_instances_left(pool, moved):
    """Each request pinned to the lost instance is pinned again, at once, to the least pinned instance
    left, and the entry hears of it (``on_moved``: it sends the request there whole); none ends."""
    transport, links, lost = pool
    links[3] = FakeLink(lambda model, error: transport.instance_lost(model, 3, error))
    transport.add("llm", 3, links[3])  # type: ignore[arg-type]
    transport.send("llm", [handoff("a"), handoff("b"), handoff("c"), handoff("d")])
    assert transport.pinned("llm") == {1: 2, 2: 1, 3: 1}
    links[1].state = CONNECTING
    transport.instance_lost("llm", 1, "model 'llm' is unreachable: no answer for 2 s")
    assert lost == [] and sorted(moved) == [("llm", "a"), ("llm", "d")]
    assert transport.pinned("llm") == {1: 0, 2: 2, 3: 2}
    sent_before = len(links[1].sent)
    transport.send("llm", [handoff("a"), handoff("d"), release("b")])  # each where it is pinned now
    assert links[2].rids("handoff")[-1] == "a" and links[3].rids("handoff")[-1] == "d"  # (ties: the lowest id)
    assert len(links[1].sent) == sent_before and links[2].rids("release") == ["b"]
    transport.send("llm", [release("a"), release("c"), release("d")])  # each release where its request is now
    assert links[2].rids("release") == ["b", "a"] and links[3].rids("release") == ["c", "d"]
    assert transport.pinned("llm") == {1: 0, 2: 0, 3: 0} and links[1].rids("release") == []


def test_an_instance_lost_while_it_still_looks_up_gets_none_of_its_requests_back(pool, moved):
    """A session an instance replaced is a loss too while its link still reads up: the requests go to
    another instance, never back to the one that forgot them."""
    transport, links, lost = pool
    transport.send("llm", [handoff("a"), handoff("b")])  # one on each: a tie would pick instance 1
    transport.instance_lost("llm", 1, "'llm' started a new session")
    assert moved == [("llm", "a")] and lost == [] and transport.pinned("llm") == {1: 0, 2: 2}
    transport.send("llm", [handoff("a")])
    assert links[2].rids("handoff") == ["b", "a"] and links[1].rids("handoff") == ["a"]


def test_a_lost_instance_with_no_other_linked_ends_its_requests_and_only_those(pool, moved):
    transport, links, lost = pool
    transport.send("llm", [handoff("a"), handoff("b"), handoff("c")])
    assert transport.pinned("llm") == {1: 2, 2: 1}
    links[2].state = CONNECTING  # the other instance is down too: nowhere to go on
    transport.instance_lost("llm", 1, "model 'llm' is unreachable: no answer for 2 s")
    assert moved == [] and sorted(rid for rid, _ in lost) == ["a", "c"]
    assert all("no answer" in error for _, error in lost)
    assert transport.pinned("llm") == {1: 0, 2: 1}
    links[1].state, links[2].state = CONNECTING, UP
    transport.send("llm", [release("a"), release("c"), handoff("d")])  # the entry ends them; a new one comes
    assert links[1].rids("release") == [] and links[2].rids("handoff") == ["b", "d"]


def test_a_handoff_to_an_instance_whose_session_is_down_moves_what_is_pinned_there(pool, moved):
    transport, links, lost = pool
    transport.send("llm", [handoff("a"), handoff("b")])
    links[1].state = CONNECTING  # its session was given up before the loss was reported
    transport.send("llm", [handoff("a"), handoff("b")])
    assert moved == [("llm", "a")] and lost == []
    assert links[2].rids("handoff") == ["b", "b"] and transport.pinned("llm") == {1: 0, 2: 2}


def test_a_request_pinned_to_an_instance_that_left_ends_with_an_error(pool):
    transport, links, lost = pool
    transport.send("llm", [handoff("a")])
    transport.remove("llm", 1)
    assert links[1].closed and transport.instances("llm") == [2]
    transport.send("llm", [handoff("a")])
    assert [rid for rid, _ in lost] == ["a"] and "is gone" in lost[0][1] and links[2].sent == []


def test_a_model_with_no_instance_up_is_the_problem_and_one_up_is_enough(pool):
    transport, links, _ = pool
    assert transport.problem() is None
    links[1].state = CONNECTING
    assert transport.problem() is None
    links[2].state = CONNECTING
    assert "no instance of model 'llm' is linked" in (transport.problem() or "")


# --- a peer's transport to the entry pool (several entry workers): no placement, owners by origin ----------
def from_llm(kind: str, rid: str) -> PeerMessage:
    return PeerMessage(kind=kind, rid=rid, sender="llm")  # type: ignore[arg-type]


@pytest.fixture
def entries() -> Pool:
    """A peer's transport to the entry pool."""
    return two_instances("slm", on_moved=None)


def test_a_peer_sends_each_request_back_to_the_entry_instance_that_owns_it(entries):
    transport, links, lost = entries
    transport.pin("slm", "a", 2)
    transport.pin("slm", "b", 1)
    transport.send("slm", [from_llm("progress", "a"), from_llm("handoff", "b"), from_llm("ended", "a")])
    assert [m.rid for batch in links[2].sent for m in batch] == ["a", "a"]
    assert [m.rid for batch in links[1].sent for m in batch] == ["b"]
    transport.send("slm", [from_llm("estimates", "")])  # about no request: every entry instance hears it
    assert links[1].sent[-1][0].kind == links[2].sent[-1][0].kind == "estimates"
    transport.unpin("slm", "a")
    assert transport.pinned("slm") == {1: 1, 2: 0} and lost == []


def test_a_peer_places_nothing_a_message_about_a_request_no_entry_owns_goes_nowhere(entries):
    """Never to the least-loaded entry instance: only the owner can finish a request; a handoff back of
    one no instance owns (its entry is gone) ends it here."""
    transport, links, lost = entries
    transport.send("slm", [from_llm("progress", "x"), from_llm("handoff", "y")])
    assert links[1].sent == [] and links[2].sent == []
    assert [rid for rid, _ in lost] == ["y"] and "owns it" in lost[0][1]
    assert transport.pinned("slm") == {1: 0, 2: 0}


def test_a_lost_entry_instance_ends_its_own_requests_here_and_moves_none_to_the_other(entries):
    transport, links, lost = entries
    for rid, owner in (("a", 1), ("b", 2), ("c", 1)):
        transport.pin("slm", rid, owner)
    links[1].state = CONNECTING
    transport.instance_lost("slm", 1, "entry 1 gone")
    assert sorted(lost) == [("a", "entry 1 gone"), ("c", "entry 1 gone")]
    assert transport.pinned("slm") == {1: 0, 2: 1}
    transport.send("slm", [from_llm("progress", "b"), from_llm("progress", "a")])
    assert [m.rid for batch in links[2].sent for m in batch] == ["b"] and links[1].sent == []
