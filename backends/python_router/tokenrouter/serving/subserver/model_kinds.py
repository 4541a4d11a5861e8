"""The kinds of Triton model the python_router backend's model.py runs: a subserver, or the
routing_policy model (policy holder).

The glue is thin: intake.py turns requests into the runtime Subserver's submissions and peer
messages; triton_sink.py and subserver_writer.py turn the subserver's output events into decoupled
responses on a thread of their own (so the decoding loop never waits on Triton's IPC); a peer link
(peer_link.py) per other subserver carries peer messages to it: over BLS within this server, with
this server start's secret (peer_auth.py), or over Triton's gRPC stream to another server of the
deployment (placement.py), with the pair secret (pair_secret.py).
"""

from __future__ import annotations

import json
import logging
import os
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ...config import TokenRouterConfig
from ...engine.factory import create_engine
from ...placement import describe
from ...runtime.assembly import build_lone_subserver, build_policy
from ...runtime.strategies import MULTI_PROCESS
from ..cpu_sampler import CpuSampler
from ..pair_secret import pair_secret
from ..peer_auth import server_secret
from ..repository import MAX_BATCH_SIZE, read_repository, served_models
from .bls_channel import SAME_SERVER, BlsChannel, ServerServing
from .grpc_channel import stream_opener
from .intake import SubserverIntake
from .metrics import SubserverMetrics
from .peer_link import PeerLink
from .peer_sessions import PeerSessions
from .placed_transport import PlacedTransport
from .sending_session import BETWEEN_SERVERS
from .subserver_writer import SubserverWriter

log = logging.getLogger(__name__)
# Exit status of a stub that takes itself down because its subserver's loop died (EX_SOFTWARE).
LOOP_DIED_EXIT = 70


def create_triton_model(pb_utils: Any, args: dict[str, str]) -> "SubserverModel | RoutingPolicyModel":
    model_config = json.loads(args["model_config"])
    kind = _parameters(model_config).get("role", "subserver")  # the parameter's name in rendered repositories
    if kind == "routing_policy":
        return RoutingPolicyModel(pb_utils, args, model_config)
    if kind == "subserver":
        return SubserverModel(pb_utils, args, model_config)
    raise ValueError(f"model '{args['model_name']}': parameter role='{kind}' is not 'subserver' or 'routing_policy'")


def _parameters(model_config: dict) -> dict[str, str]:
    return {key: value.get("string_value", "") for key, value in model_config.get("parameters", {}).items()}


class RoutingPolicyModel:
    """The routing_policy model: carries the policy, its weights and the scheduling settings, and
    answers a request with them as JSON (introspection)."""

    def __init__(self, pb_utils: Any, args: dict[str, str], model_config: dict) -> None:
        self._pb = pb_utils
        self._config = read_repository(Path(args["model_repository"]).parent)
        build_policy(self._config)  # fail the load now if the policy or its weights are wrong
        self._batch_dim = model_config.get("max_batch_size", 0) > 0

    def execute(self, requests: list) -> list:
        policy = self._config.policy
        description = json.dumps({"policy": policy.name, "params": policy.params, "weights": policy.weights,
                                  "models": self._config.model_names, "entry": self._config.entry,
                                  "strategy": self._config.scheduling.strategy})
        payload = np.array([description.encode()], dtype=np.object_)
        if self._batch_dim:
            payload = payload.reshape(1, 1)
        return [self._pb.InferenceResponse([self._pb.Tensor("policy", payload)]) for _ in requests]

    def finalize(self) -> None:
        pass


class SubserverModel:
    def __init__(self, pb_utils: Any, args: dict[str, str], model_config: dict) -> None:
        self._pb = pb_utils
        self.name = args["model_name"]
        self._sampler = CpuSampler.from_env(self.name)  # off unless TOKENROUTER_PROFILE names a folder
        repository = Path(args["model_repository"]).parent
        config = read_repository(repository)
        here = served_models(repository)
        remote = [name for name in config.model_names if name not in here]
        if config.scheduling.strategy not in MULTI_PROCESS:
            raise ValueError(f"strategy '{config.scheduling.strategy}' needs all models in one process; in Triton "
                             f"use one of {', '.join(MULTI_PROCESS)} (the embedded API runs the others)")
        if self.name not in config.models:
            raise ValueError(f"model '{self.name}' is not in the routing_policy model's list {config.model_names}")
        if model_config.get("max_batch_size", 0) != MAX_BATCH_SIZE:
            raise ValueError(f"model '{self.name}': max_batch_size must be {MAX_BATCH_SIZE} (one request per Triton "
                             f"request, each tensor with its batch dimension); the subserver batches on its own")
        engine = create_engine(self.name, config.models[self.name], owns_process=True)  # one stub, one model
        secret = server_secret()
        self._remote = frozenset(remote)
        self._transport = PlacedTransport()
        self.subserver = build_lone_subserver(config, self.name, engine, self._transport)
        self._writer = SubserverWriter(pb_utils, self.subserver,
                                       max_responses_per_s=config.scheduling.max_responses_per_s)
        self._metrics = SubserverMetrics(pb_utils, self.subserver, remote_peers=remote)
        self._serving = ServerServing()
        sessions = self._connect_peers(config, here, secret, self._serving)
        self._intake = SubserverIntake(pb_utils, self.subserver, self._writer, config.model_names, secret,
                                       on_refused_peer_call=self._metrics.count_refused_peer_call,
                                       sessions=sessions, not_whole=self._transport.problem)
        self.subserver.start(on_death=self._exit_now_the_loop_died)

    def _exit_now_the_loop_died(self) -> None:
        """A dead loop has failed its requests, but Triton 2.51 gives a Python model no way to say it
        is unhealthy: the model would stay READY and take requests it can only refuse. So once the
        error responses are out, the stub ends itself (on the dead loop's thread); the launcher's
        supervisor sees a dead stub, takes the server down and starts it again (docs/reliability.md)."""
        self._writer.close()  # sends what is queued (the requests' errors) first
        log.critical("model %s: the subserver loop died (%s); ending this stub", self.name, self.subserver.failure)
        os._exit(LOOP_DIED_EXIT)

    def _connect_peers(self, config: TokenRouterConfig, here: list[str], secret: str,
                       server_serving: ServerServing) -> PeerSessions:
        """A link to each other model (BLS within this server, Triton's stream to another), and the
        sessions of their links to this one. ``secret``: this server start's."""
        secrets = {peer: secret for peer in config.model_names if peer in here and peer != self.name}
        if self._remote:
            pair = pair_secret()  # a node without it does not load: the message says how to give it
            secrets.update({peer: pair for peer in self._remote})
        view = describe(config, here)
        transport = config.transport
        for peer, peer_secret in secrets.items():
            if peer in self._remote:
                address = config.models[peer].server
                if address is None:  # a model this repository does not serve must say where it runs
                    raise ValueError(f"model '{peer}' is not served here and names no server (models.{peer}.server: "
                                     "HOST:PORT)")
                open_channel, pacing, delay_s = stream_opener(address, peer), BETWEEN_SERVERS, transport.delay_ms / 1e3
            else:
                address, pacing, delay_s = "this server", SAME_SERVER, 0.0
                open_channel = partial(BlsChannel, self._pb, peer, server_serving=server_serving)
            self._transport.add_link(PeerLink(
                self.name, peer, address, open_channel, secret=peer_secret, view=view, pacing=pacing,
                down_after_s=transport.down_after_s, delay_s=delay_s, on_up=self._on_peer_up,
                on_down=self._on_peer_down, on_round_trip=self._metrics.observe_round_trip),
                remote=peer in self._remote)
        return PeerSessions(view, secrets, here=f"'{self.name}' at {config.models[self.name].server or 'this server'}",
                            on_session_lost=self.subserver.peer_lost)

    def _on_peer_up(self, peer: str) -> None:
        if peer in self._remote:
            self._metrics.peer_connected(peer, True)

    def _on_peer_down(self, peer: str, error: str) -> None:
        if peer in self._remote:
            self._metrics.peer_connected(peer, False)
        self.subserver.peer_lost(peer, error)

    def execute(self, requests: list) -> None:
        self._serving.saw_a_request()
        self._intake.execute(requests)
        return None

    def finalize(self) -> None:
        self.subserver.stop()
        self._writer.close()
        self._transport.close()
        self._metrics.close()
        self.subserver.engine.close()
        if self._sampler is not None:
            self._sampler.stop()
