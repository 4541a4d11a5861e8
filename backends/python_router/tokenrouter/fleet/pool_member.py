"""One model's subserver as a Dynamo worker of a split pair (entry_engine.py: the small model, served
to the frontend; peer_worker.py: the large model, a peer endpoint only).

The subserver is built as a Triton subserver on its own server is (model_kinds.py): the runtime's
``build_lone_subserver`` whose peers are ``PeerLink``s; the link's channel differs (dynamo_channel.py:
Dynamo's worker-to-worker call instead of Triton's gRPC stream), and so does the transport (a link per
instance of the other model's pool). Each worker serves:

- ``<namespace>.<model>.peer``: the receiving end of the other workers' links (peer_sessions.py);
- ``<namespace>.<model>.stats``: its instance id, KV blocks in use, requests held, tokens computed, the
  other model's instances linked and the requests pinned to each (and at a peer, the N of all entries):
  tests and operators read a worker's load there.

Every worker reaches the other model's pool of instances through pinned_transport.py (a link per
instance, watched as instances join and leave): the entry pins each request to one peer instance; a
peer sends what it has of a request back to the entry instance that handed it over (entry_owners.py).
With M entry workers, each admits against 1/M of a peer instance's KV (kv_share.py). A split pair over
pools has two models (the entry and one peer model).

The deployment's secret (pair_secret.py) signs every link call; each worker's view of the deployment
(placement.describe) must equal its peers' or their hellos are refused.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from ..config import TokenRouterConfig, load_config
from ..engine.factory import create_engine
from ..placement import describe
from ..runtime.assembly import build_lone_subserver
from ..runtime.strategies import MULTI_PROCESS
from ..runtime.subserver import Subserver
from ..serving.pair_secret import pair_secret
from ..serving.subserver.peer_link import PeerLink
from ..serving.subserver.peer_sessions import PeerSessions
from ..serving.subserver.sending_session import BETWEEN_SERVERS, CONNECTING, Pacing
from .dynamo_channel import OriginSessions, direct_opener, peer_handler
from .entry_owners import EntryOwners
from .kv_share import entry_capacities
from .pinned_transport import PinnedTransport

log = logging.getLogger(__name__)
PEER_ENDPOINT, STATS_ENDPOINT = "peer", "stats"
WATCH_PERIOD_S = 0.5  # how often a worker looks for instances that joined or left the other pool
# A peer may get an entry instance's first request before its own link to that instance is up (each
# side finds the other within WATCH_PERIOD_S): what it answers waits for the link (up to down_after_s)
# instead of being dropped. The entry places requests only on peer instances whose link is up.
TO_AN_ENTRY = Pacing(hold_while_connecting=True)


def endpoint_path(namespace: str, model: str, endpoint: str) -> str:
    return f"{namespace}.{model}.{endpoint}"


class PoolMember:
    def __init__(self, config: TokenRouterConfig, name: str, subserver: Subserver, transport: PinnedTransport,
                 owners: EntryOwners | None) -> None:
        self.config, self.name, self.subserver, self.transport = config, name, subserver, transport
        self.owners = owners  # a peer's: which entry instance owns each request
        self._loop = asyncio.get_running_loop()
        self._served: list[asyncio.Future] = []
        self.instance: int | None = None  # this worker's instance id (its peers' clients address it so)

    @classmethod
    async def start(cls, config_path: str | Path, name: str, runtime: Any, namespace: str,
                    on_death: Callable[[], None], entries: int = 1) -> "PoolMember":
        """Builds model ``name``'s subserver, serves its endpoints, links it to the other model's workers
        and starts its loop. ``on_death()``: the loop died (the worker should exit). ``entries``: the
        entry workers sharing the peer pool (an entry admits against its share: kv_share.py)."""
        config = load_config(config_path)
        if name not in config.models:
            raise ValueError(f"model '{name}' is not in the config's models {config.model_names}")
        if len(config.models) != 2:
            raise ValueError(f"a pair split over pools has two models; the config has {config.model_names}")
        if config.scheduling.strategy not in MULTI_PROCESS:
            raise ValueError(f"strategy '{config.scheduling.strategy}' needs all models in one process; a split "
                             f"pair runs one of {', '.join(MULTI_PROCESS)}")
        secret = pair_secret()  # before the weights load: a worker without it says so at once
        loop = asyncio.get_running_loop()
        # Loading weights: off the event loop, which serves Dynamo's runtime meanwhile.
        engine = await loop.run_in_executor(None, lambda: create_engine(name, config.models[name], owns_process=True))
        (other,) = [model for model in config.model_names if model != name]
        if name == config.entry:  # places each request on a peer instance; a lost one's requests move
            transport = PinnedTransport(on_lost=lambda rid, error: subserver.fail(rid, error),
                                        on_moved=lambda peer, rid: subserver.peer_forgot(peer, rid))
            subserver = build_lone_subserver(config, name, engine, transport, entry_capacities(config, entries))
            owners = None
            deliver = lambda message, origin: subserver.deliver(message)  # noqa: E731
        else:  # sends back to the entry instance that owns each request; a lost one's requests end here
            transport = PinnedTransport(on_lost=lambda rid, error: subserver.fail(rid, error))
            subserver = build_lone_subserver(config, name, engine, transport)
            owners = deliver = EntryOwners(transport, other, subserver.deliver)
        member = cls(config, name, subserver, transport, owners)
        view = describe(config, [name])
        peer_endpoint = runtime.endpoint(endpoint_path(namespace, name, PEER_ENDPOINT))
        member._serve(peer_endpoint, peer_handler(member._receiving(secret, view, other), deliver))
        member._serve(runtime.endpoint(endpoint_path(namespace, name, STATS_ENDPOINT)), member._answer_stats)
        origin = member.instance = peer_endpoint.connection_id()
        client = await runtime.endpoint(endpoint_path(namespace, other, PEER_ENDPOINT)).client()

        def link(instance: Callable[[], int | None], address: str, on_down: Callable[[str, str], None]) -> PeerLink:
            return PeerLink(name, other, address, direct_opener(client, loop, instance, origin), secret=secret,
                            view=view, down_after_s=config.transport.down_after_s,
                            delay_s=config.transport.delay_ms / 1e3,
                            on_up=lambda peer: log.info("%s: linked to %s at %s", name, peer, address),
                            on_down=on_down, pacing=BETWEEN_SERVERS if owners is None else TO_AN_ENTRY)

        member._served.append(asyncio.ensure_future(_watch_pool(member._instance_lost, transport, other, client, link)))
        subserver.start(on_death=on_death)
        return member

    def _instance_lost(self, model: str, instance: int, error: str) -> None:
        """An instance of the other model is lost (its session given up, or replaced by a new one): the
        transport moves or ends what was pinned there; at a peer, a lost entry's N leaves the sum."""
        self.transport.instance_lost(model, instance, error)
        if self.owners is not None:
            self.owners.entry_lost(instance)

    def _receiving(self, secret: str, view: dict[str, Any], sender: str) -> OriginSessions:
        """The receiving sessions, one per sending instance of the other model: a session an instance
        replaced, or gave up, loses what that instance had pinned here."""
        here = f"'{self.name}' (Dynamo worker)"
        return OriginSessions(lambda origin: PeerSessions(
            view, {sender: secret}, here=here,
            on_session_lost=lambda sender, why: self._instance_lost(sender, origin, why)))

    def problem(self) -> str | None:
        """Why the pair cannot serve now (a peer model with no worker linked), or None."""
        return self.transport.problem()

    async def wait_whole(self, period_s: float = 0.1) -> None:
        """Until a link to every other model is up (the peer workers may start after this one)."""
        told = None
        while (problem := self.problem()) is not None or not self._linked_every_model():
            problem = problem or "no peer instance registered yet"
            if problem != told:
                log.info("%s: waiting for its peers: %s", self.name, problem)
                told = problem
            await asyncio.sleep(period_s)

    def _linked_every_model(self) -> bool:
        return all(self.transport.instances(peer) for peer in self.config.model_names if peer != self.name)

    def stats(self) -> dict[str, Any]:
        stats = self.subserver.stats
        answer = {"model": self.name, "instance": self.instance, "pid": os.getpid(),
                  "kv_blocks_used": self.subserver.engine.num_used_blocks,
                  "requests_held": len(self.subserver.requests), "tokens_committed": stats.tokens_committed,
                  "steps": stats.steps, "handoffs_in": stats.handoffs_in, "handoffs_out": stats.handoffs_out,
                  "alive": self.subserver.alive}
        peers = [peer for peer in self.config.model_names if peer != self.name]
        answer["pinned"] = {peer: {str(k): v for k, v in self.transport.pinned(peer).items()} for peer in peers}
        answer["linked"] = {peer: [str(k) for k in self.transport.linked(peer)] for peer in peers}
        if self.owners is not None:
            answer["active"] = self.owners.active()  # the N its delayed batching reads (all entries')
        return answer

    async def _answer_stats(self, request: Any, context: Any = None) -> AsyncIterator[dict[str, Any]]:
        del request, context
        yield self.stats()

    def _serve(self, endpoint: Any, handler: Callable[..., AsyncIterator[Any]]) -> None:
        # (Dynamo's serve_endpoint returns a future, not a coroutine)
        self._served.append(asyncio.ensure_future(endpoint.serve_endpoint(handler)))

    def close(self) -> None:
        """From any thread (the workers call it off the event loop)."""
        for task in self._served:  # first: the pool's watch adds no link once the transport closes
            self._loop.call_soon_threadsafe(task.cancel)
        self.subserver.stop()
        self.transport.close()
        self.subserver.engine.close()


async def _watch_pool(instance_lost: Callable[[str, int, str], None], transport: PinnedTransport, model: str,
                      client: Any, link: Callable[..., PeerLink]) -> None:
    """Keeps a link to every registered instance of ``model``: a new one gets its link at once; one
    that left discovery loses it once its session is given up (``instance_lost`` moved or ended what was
    pinned there)."""
    while True:
        try:
            registered = set(client.instance_ids())
            known = transport.instances(model)
            for instance in registered - set(known):
                transport.add(model, instance, link(
                    lambda instance=instance: instance if instance in client.instance_ids() else None,
                    f"{model} instance {instance:x}",
                    lambda _peer, error, instance=instance: instance_lost(model, instance, error)))
            for instance in set(known) - registered:
                if transport.link_state(model, instance) == CONNECTING:  # (given up: nothing is pinned there)
                    transport.remove(model, instance)
        except Exception:  # noqa: BLE001 - a bug here must not stop the watch: the pool would freeze
            log.exception("watching the instances of %s failed; looking again", model)
        await asyncio.sleep(WATCH_PERIOD_S)
