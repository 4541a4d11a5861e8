"""A worker's transport to a pool of instances of another model (several Dynamo workers of it): a link
per instance (peer_link.py over dynamo_channel.py), and each request pinned to one instance for its life.

At the entry (given ``on_moved``), the pool is a peer model's:

- **Placement**: a request's first handoff to a model goes to the instance with the fewest pinned
  requests among those whose link is up; every later message about it (its later handoffs, its
  release) goes to that instance, so its KV there stays where it was computed and a return visit is an
  append. The release unpins it. Messages about no request (``active``, ``estimates``) go to every
  instance.
- **Admission** stays the entry core's, against this entry's share of one instance's KV
  (kv_share.py): the requests pinned across the pool never exceed what any one instance holds.
- **Loss**: when an instance's session is given up (it died, or did not answer for
  ``transport.down_after_s``), each request pinned to it is pinned to another linked instance of the
  model (placed as a new one) and ``on_moved(model, rid)`` tells the entry, which sends it there whole
  (a first visit: the entry holds every token of it). With no other instance linked, it ends with an
  error (``on_lost(rid, error)``). A new request goes to the instances left. Instances that register
  later get a link of their own.

At a peer (no ``on_moved``), the pool is the entry model's (several entry workers): a request is
pinned to the entry instance that handed it here (``pin``, by the call's origin: entry_owners.py) and
every message about it goes back there; nothing is placed or moved. A lost entry instance ends (here)
every request pinned to it (``on_lost``): only that entry could finish them.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence

from ..protocol import PeerMessage
from ..runtime.transport import Transport
from ..serving.subserver.peer_link import PeerLink
from ..serving.subserver.sending_session import UP

log = logging.getLogger(__name__)


class PinnedTransport(Transport):
    def __init__(self, on_lost: Callable[[str, str], None],
                 on_moved: Callable[[str, str], None] | None = None) -> None:
        """``on_moved``: the entry's (it places requests); None: a peer's transport, which places nothing."""
        self._on_lost, self._on_moved, self._places = on_lost, on_moved, on_moved is not None
        self._lock = threading.Lock()  # links come and go on Dynamo's loop; sends come from the subserver's
        self._links: dict[str, dict[int, PeerLink]] = defaultdict(dict)  # model -> instance -> link
        self._pins: dict[str, dict[str, int]] = defaultdict(dict)  # model -> rid -> instance

    # --- the pool's membership (Dynamo's loop) ------------------------------------------------------
    def add(self, model: str, instance: int, link: PeerLink) -> None:
        with self._lock:
            self._links[model][instance] = link

    def instances(self, model: str) -> list[int]:
        with self._lock:
            return list(self._links[model])

    def linked(self, model: str) -> list[int]:
        """The instances of ``model`` whose link is up now (those a new request may go to)."""
        with self._lock:
            return sorted(instance for instance, link in self._links[model].items() if link.state == UP)

    def link_state(self, model: str, instance: int) -> str | None:
        with self._lock:
            link = self._links[model].get(instance)
        return None if link is None else link.state

    def remove(self, model: str, instance: int) -> None:
        """An instance that left discovery and whose session is given up: its link ends."""
        with self._lock:
            link = self._links[model].pop(instance, None)
        if link is not None:
            link.close()

    def pin(self, model: str, rid: str, instance: int) -> None:
        """``rid`` belongs to ``instance`` of ``model`` (at a peer: the entry instance that handed it here)."""
        with self._lock:
            self._pins[model][rid] = instance

    def unpin(self, model: str, rid: str) -> None:
        with self._lock:
            self._pins[model].pop(rid, None)

    def instance_lost(self, model: str, instance: int, error: str) -> None:
        """The session to ``instance`` was given up: what was pinned there moves to the other linked
        instances (``on_moved``), or ends with ``error`` when there is none (``on_lost``)."""
        with self._lock:
            pins = self._pins[model]
            others = {other: link for other, link in self._links[model].items() if other != instance}
            lost: list[str] = []
            moved: list[str] = []
            for rid in [rid for rid, pinned in pins.items() if pinned == instance]:
                # Pinned at once (not at its next handoff): a handoff sent meanwhile must not land on the
                # lost instance again, which may still look up (a session it replaced) yet holds nothing.
                target = self._place(others, pins)
                if target is None:
                    del pins[rid]
                    lost.append(rid)
                else:
                    pins[rid] = target
                    moved.append(rid)
        if moved:
            log.warning("%s instance %x lost: %d request(s) go on at other instances: %s", model, instance,
                        len(moved), error)
        if lost:
            log.error("%s instance %x lost with %d request(s), %s: %s", model, instance, len(lost),
                      "no other instance linked" if self._places else "which end here", error)
        for rid in moved:
            assert self._on_moved is not None  # (only a transport that places moves)
            self._on_moved(model, rid)
        for rid in lost:
            self._on_lost(rid, error)

    def pinned(self, model: str) -> dict[int, int]:
        """Requests pinned to each instance of ``model`` now."""
        with self._lock:
            counts = dict.fromkeys(self._links[model], 0)
            for instance in self._pins[model].values():
                counts[instance] = counts.get(instance, 0) + 1
            return counts

    def problem(self) -> str | None:
        """Why a request could not be served now (a model with no instance linked), or None."""
        with self._lock:
            for model, links in self._links.items():
                if not any(link.state == UP for link in links.values()):
                    reasons = "; ".join(p for link in links.values() if (p := link.problem)) or "none registered"
                    return f"no instance of model '{model}' is linked ({reasons})"
        return None

    # --- Transport (the subserver's loop) ------------------------------------------------------------
    def send(self, peer: str, messages: Sequence[PeerMessage]) -> None:
        """Never raises: a handoff that cannot be placed (no instance up, its instance gone) ends that
        request alone (``on_lost``), while the rest of the step's messages still go to their instances; a
        link whose session is down reports its instance lost (``instance_lost``: what is pinned there ends)."""
        batches: dict[PeerLink, list[PeerMessage]] = defaultdict(list)
        lost: list[tuple[str, str]] = []
        with self._lock:
            links, pins = self._links[peer], self._pins[peer]
            for message in messages:
                if not message.rid:  # about no request: every instance hears it
                    for link in links.values():
                        if link.state == UP:
                            batches[link].append(message)
                    continue
                instance = pins.get(message.rid)
                if instance is None:
                    if message.kind != "handoff":
                        continue  # a release of a request never placed here: nothing to free
                    instance = self._place(links, pins)
                    if instance is None:
                        lost.append((message.rid, f"no instance of model '{peer}' is linked" if self._places
                                     else f"no instance of model '{peer}' owns it (it is gone, or the request ended)"))
                        continue
                    pins[message.rid] = instance
                if message.kind == "release":
                    del pins[message.rid]
                if (target := links.get(instance)) is not None:
                    batches[target].append(message)
                elif message.kind == "handoff":
                    lost.append((message.rid, f"instance {instance:x} of model '{peer}' is gone"))
        for link, batch in batches.items():
            link.send(batch)  # a link whose session is down reports the loss (instance_lost) instead
        for rid, error in lost:
            with self._lock:
                pins.pop(rid, None)
            self._on_lost(rid, error)

    def _place(self, links: dict[int, PeerLink], pins: dict[str, int]) -> int | None:
        """The up instance with the fewest pinned requests (ties: the lowest id); None if none is up, or
        if this transport does not place (a peer's: a request belongs to the entry instance that sent it)."""
        if not self._places:
            return None
        load = {instance: 0 for instance, link in links.items() if link.state == UP}
        if not load:
            return None
        for instance in pins.values():
            if instance in load:
                load[instance] += 1
        return min(load, key=lambda instance: (load[instance], instance))

    def close(self) -> None:
        with self._lock:
            links = [link for by_instance in self._links.values() for link in by_instance.values()]
            self._links.clear()
        for link in links:
            link.close()
