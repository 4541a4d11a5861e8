"""At a peer of several entry workers: each request's owner read off the calls' origins, and the N the
peer's delayed batching reads (the sum of the entries')."""

from __future__ import annotations

from tokenrouter.fleet.entry_owners import EntryOwners
from tokenrouter.fleet.pinned_transport import PinnedTransport
from tokenrouter.protocol import PeerMessage


def message(kind: str, rid: str = "", active: int | None = None, sender: str = "slm") -> PeerMessage:
    return PeerMessage(kind=kind, rid=rid, sender=sender, active=active)  # type: ignore[arg-type]


def owners_with(delivered: list[PeerMessage]) -> tuple[EntryOwners, PinnedTransport]:
    transport = PinnedTransport(on_lost=lambda rid, error: None)
    return EntryOwners(transport, "slm", delivered.append), transport


def test_a_handoff_pins_its_request_to_the_sending_entry_and_the_release_unpins_it():
    delivered: list[PeerMessage] = []
    owners, transport = owners_with(delivered)
    owners(message("handoff", "a"), 7)
    owners(message("handoff", "b"), 9)
    owners(message("handoff", "a"), 7)  # a return visit: still entry 7's
    assert transport.pinned("slm") == {7: 1, 9: 1}
    owners(message("release", "a"), 7)
    assert transport.pinned("slm") == {9: 1}
    assert [m.rid for m in delivered] == ["a", "b", "a", "a"]  # every message still reaches the subserver


def test_the_peer_reads_n_as_the_sum_of_every_entry_s_and_a_lost_entry_leaves_it():
    delivered: list[PeerMessage] = []
    owners, _ = owners_with(delivered)
    owners(message("active", active=3), 7)
    owners(message("active", active=5), 9)
    owners(message("handoff", "a", active=4), 7)  # a handoff carries its sender's N too
    assert [m.active for m in delivered] == [3, 8, 9] and owners.active() == 9
    owners.entry_lost(9)
    assert delivered[-1].kind == "active" and delivered[-1].active == 4
    owners.entry_lost(9)  # told twice (its link and its session): the sum is told once
    assert len(delivered) == 4
