"""One model's subserver as a Dynamo worker of a split pair (entry_engine.py: the small model, served
to the frontend; peer_worker.py: the large model, a peer endpoint only).

The subserver is built exactly as a Triton subserver on its own server is (model_kinds.py): the
runtime's ``build_subserver`` with a ``PlacedTransport`` whose every peer is a ``PeerLink``; only the
link's channel differs (dynamo_channel.py: Dynamo's worker-to-worker call instead of Triton's gRPC
stream). Each worker serves:

- ``<namespace>.<model>.peer``: the receiving end of the other workers' links (peer_sessions.py);
- ``<namespace>.<model>.stats``: its KV blocks in use, requests held and tokens computed (tests and
  operators read a worker's load and leaks there).

The deployment's secret (pair_secret.py) signs every link call; each worker's view of the deployment
(placement.describe) must equal its peers' or their hellos are refused.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from ..config import TokenRouterConfig, load_config
from ..engine.factory import create_engine
from ..placement import describe
from ..runtime.assembly import build_policy, build_subserver, effective_max_model_len, kv_capacity
from ..runtime.strategies import MULTI_PROCESS, make_strategy
from ..runtime.subserver import Subserver
from ..runtime.transport import InProcessTransport
from ..serving.pair_secret import pair_secret
from ..serving.subserver.peer_link import PeerLink
from ..serving.subserver.peer_sessions import PeerSessions
from ..serving.subserver.placed_transport import PlacedTransport
from .dynamo_channel import direct_opener, peer_handler

log = logging.getLogger(__name__)
PEER_ENDPOINT, STATS_ENDPOINT = "peer", "stats"


def endpoint_path(namespace: str, model: str, endpoint: str) -> str:
    return f"{namespace}.{model}.{endpoint}"


class PoolMember:
    def __init__(self, config: TokenRouterConfig, name: str, subserver: Subserver, transport: PlacedTransport) -> None:
        self.config, self.name, self.subserver, self.transport = config, name, subserver, transport
        self._served: list[asyncio.Future] = []

    @classmethod
    async def start(cls, config_path: str | Path, name: str, runtime: Any, namespace: str,
                    on_death: Callable[[], None]) -> "PoolMember":
        """Builds model ``name``'s subserver, serves its endpoints, links it to every other model's
        worker and starts its loop. ``on_death()``: the loop died (the worker should exit)."""
        config = load_config(config_path)
        if name not in config.models:
            raise ValueError(f"model '{name}' is not in the config's models {config.model_names}")
        if config.scheduling.strategy not in MULTI_PROCESS:
            raise ValueError(f"strategy '{config.scheduling.strategy}' needs all models in one process; a split "
                             f"pair runs one of {', '.join(MULTI_PROCESS)}")
        secret = pair_secret()  # before the weights load: a worker without it says so at once
        loop = asyncio.get_running_loop()
        # Loading weights: off the event loop, which serves Dynamo's runtime meanwhile.
        engine = await loop.run_in_executor(None, lambda: create_engine(name, config.models[name], owns_process=True))
        transport = PlacedTransport(InProcessTransport())  # every peer is a link: nothing stays in-process
        subserver = build_subserver(config, name, engine, build_policy(config), transport,
                                    make_strategy(config.scheduling.strategy, len(config.models)),
                                    max_model_len=effective_max_model_len(config, [engine.max_model_len]),
                                    capacities={n: kv_capacity(spec) for n, spec in config.models.items()})
        member = cls(config, name, subserver, transport)
        view = describe(config, [name])
        others = [peer for peer in config.model_names if peer != name]
        sessions = PeerSessions(secret, view, others, here=f"'{name}' (Dynamo worker)",
                                on_session_lost=subserver.peer_lost)
        member._serve(runtime.endpoint(endpoint_path(namespace, name, PEER_ENDPOINT)),
                      peer_handler(sessions, subserver.deliver))
        member._serve(runtime.endpoint(endpoint_path(namespace, name, STATS_ENDPOINT)), member._answer_stats)
        for peer in others:
            path = endpoint_path(namespace, peer, PEER_ENDPOINT)
            client = await runtime.endpoint(path).client()
            transport.add_link(PeerLink(
                name, peer, path, direct_opener(client, loop, lambda client=client: _first_instance(client)),
                secret=secret, view=view, down_after_s=config.transport.down_after_s,
                delay_s=config.transport.delay_ms / 1e3, on_up=lambda peer: log.info("%s: linked to %s", name, peer),
                on_down=subserver.peer_lost, on_failure=subserver.fail))
        subserver.start(on_death=on_death)
        return member

    def problem(self) -> str | None:
        """Why the pair is not whole now (a peer worker not linked), or None."""
        return self.transport.problem()

    async def wait_whole(self, period_s: float = 0.1) -> None:
        """Until every link is up (the peer workers may start after this one)."""
        told = None
        while (problem := self.problem()) is not None:
            if problem != told:
                log.info("%s: waiting for its peers: %s", self.name, problem)
                told = problem
            await asyncio.sleep(period_s)

    def stats(self) -> dict[str, Any]:
        stats = self.subserver.stats
        return {"model": self.name, "kv_blocks_used": self.subserver.engine.num_used_blocks,
                "requests_held": len(self.subserver.requests), "tokens_committed": stats.tokens_committed,
                "steps": stats.steps, "handoffs_in": stats.handoffs_in, "handoffs_out": stats.handoffs_out,
                "alive": self.subserver.alive}

    async def _answer_stats(self, request: Any, context: Any = None) -> AsyncIterator[dict[str, Any]]:
        del request, context
        yield self.stats()

    def _serve(self, endpoint: Any, handler: Callable[..., AsyncIterator[Any]]) -> None:
        # (Dynamo's serve_endpoint returns a future, not a coroutine)
        self._served.append(asyncio.ensure_future(endpoint.serve_endpoint(handler)))

    def close(self) -> None:
        self.subserver.stop()
        self.transport.close()
        self.subserver.engine.close()
        for task in self._served:
            task.cancel()


def _first_instance(client: Any) -> int | None:
    """The peer's instance (a split pair has one per model)."""
    ids = client.instance_ids()
    return ids[0] if ids else None
