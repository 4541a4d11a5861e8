"""What the python_router backend's model.py runs: a subserver, or the router (policy holder).

The glue is thin: it parses tensors into a RequestSpec, feeds the runtime's Subserver, and turns
the subserver's output events into decoupled responses on a separate response thread (so the
decoding loop never waits on Triton's IPC). Peer messages arrive as requests with only
``peer_message`` set and are acknowledged at once.
"""

from __future__ import annotations

import itertools
import json
import logging
import queue
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..engine.factory import create_engine
from ..runtime.assembly import build_policy, build_subserver, effective_max_model_len, kv_capacity
from ..runtime.messages import RequestSpec, decode_batch
from ..runtime.request import RequestError
from ..runtime.strategies import make_strategy
from .bls_transport import PEER_INPUT, BlsTransport
from .metrics import SubserverMetrics
from .repository import read_repository

log = logging.getLogger(__name__)

PREFIX_WINDOW = 8  # tokens before a chunk that postprocessing needs to decode it UTF-8-safely
CANCEL_POLL_S = 0.02
ASYNC_STRATEGIES = ("tokenrouter", "eager_async")


def create_role(pb_utils: Any, args: dict[str, str]) -> "SubserverRole | RouterRole":
    model_config = json.loads(args["model_config"])
    role = _parameters(model_config).get("role", "subserver")
    if role == "router":
        return RouterRole(pb_utils, args, model_config)
    if role == "subserver":
        return SubserverRole(pb_utils, args, model_config)
    raise ValueError(f"model '{args['model_name']}': parameter role='{role}' is not 'subserver' or 'router'")


def _parameters(model_config: dict) -> dict[str, str]:
    return {key: value.get("string_value", "") for key, value in model_config.get("parameters", {}).items()}


class RouterRole:
    """Carries the policy. Answers a request with the policy it carries, as JSON (introspection)."""

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


class SubserverRole:
    def __init__(self, pb_utils: Any, args: dict[str, str], model_config: dict) -> None:
        self._pb = pb_utils
        self.name = args["model_name"]
        config = read_repository(Path(args["model_repository"]).parent)
        if config.scheduling.strategy not in ASYNC_STRATEGIES:
            raise ValueError(f"strategy '{config.scheduling.strategy}' needs all models in one process; in Triton "
                             f"use one of {', '.join(ASYNC_STRATEGIES)} (the embedded API runs the others)")
        if self.name not in config.models:
            raise ValueError(f"model '{self.name}' is not in the router's model list {config.model_names}")
        self._batch_dim = model_config.get("max_batch_size", 0) > 0
        engine = create_engine(self.name, config.models[self.name], owns_process=True)  # one stub, one model
        max_model_len = effective_max_model_len(config, [engine.max_model_len])
        capacities = {name: kv_capacity(spec) for name, spec in config.models.items()}
        self._transport = BlsTransport(pb_utils, batch_dim=self._batch_dim, on_failure=self._on_transport_failure,
                                       on_round_trip=lambda seconds: self._metrics.observe_round_trip(seconds))
        self.subserver = build_subserver(config, self.name, engine, build_policy(config), self._transport,
                                         make_strategy(config.scheduling.strategy, len(config.models)),
                                         max_model_len=max_model_len, capacities=capacities)
        self._entry_name = config.entry
        self._names = config.model_names
        self._writer = ResponseWriter(pb_utils, self.subserver, self._batch_dim)
        self._metrics = SubserverMetrics(pb_utils, self.subserver)
        self._ids = itertools.count()
        self.subserver.start()

    def _on_transport_failure(self, rid: str, error: str) -> None:
        self.subserver.fail(rid, error)

    def execute(self, requests: list) -> None:
        for request in requests:
            sender = request.get_response_sender()
            peer = self._pb.get_input_tensor_by_name(request, PEER_INPUT)
            try:
                if peer is not None:
                    for message in decode_batch(peer.as_numpy().reshape(-1)[0]):
                        self.subserver.deliver(message)
                    sender.send(flags=self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                else:
                    self._submit(request, sender)
            except (RequestError, ValueError, TypeError) as exc:
                self._reject(sender, str(exc))
        return None

    def _submit(self, request: Any, sender: Any) -> None:
        prompt = self._array(request, "input_ids")
        if prompt is None:
            raise RequestError("input_ids is required")
        if prompt.ndim > 1 and prompt.shape[0] != 1:
            raise RequestError(f"one prompt per request, got a batch of {prompt.shape[0]}")
        spec = RequestSpec(
            prompt_len=int(prompt.size),
            max_tokens=self._scalar(request, "max_tokens", 16, int),
            temperature=self._scalar(request, "temperature", 0.0, float),
            top_p=self._scalar(request, "top_p", 1.0, float),
            top_k=self._scalar(request, "top_k", 0, int),
            seed=self._scalar(request, "random_seed", 0, int),
            end_ids=[] if (ends := self._array(request, "end_id")) is None else [int(t) for t in ends.reshape(-1)],
            stop_sequences=self._sequences(request, "stop_ids"),
            bad_sequences=self._sequences(request, "bad_ids"),
        )
        if not spec.end_ids:
            spec.end_ids = sorted(self.subserver.engine.eos_token_ids)
        stream = self._scalar(request, "stream", False, bool)
        rid = f"{self.name}-{next(self._ids)}"
        sink = TritonSink(self._writer, rid, sender, stream, self._names, self.subserver.index)
        self._writer.track(rid, sender)
        try:
            self.subserver.submit(rid, [int(t) for t in prompt.reshape(-1)], spec, sink)
        except RequestError:
            self._writer.untrack(rid)
            raise

    def _array(self, request: Any, name: str) -> np.ndarray | None:
        tensor = self._pb.get_input_tensor_by_name(request, name)
        return None if tensor is None else tensor.as_numpy()

    def _sequences(self, request: Any, name: str) -> list[list[int]]:
        flat = self._array(request, name)
        return [] if flat is None else _split_sequences(flat.reshape(-1).tolist())

    def _scalar(self, request: Any, name: str, default: Any, kind: type) -> Any:
        array = self._array(request, name)
        if array is None:
            return default
        if array.size != 1:
            raise RequestError(f"{name} must hold one value, got {array.size}")
        return kind(array.reshape(-1)[0])

    def _reject(self, sender: Any, message: str) -> None:
        error = self._pb.TritonError(message, self._pb.TritonError.INVALID_ARG)
        sender.send(self._pb.InferenceResponse(output_tensors=[], error=error),
                    flags=self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self) -> None:
        self.subserver.stop()
        self._writer.close()
        self._transport.close()
        self._metrics.close()
        self.subserver.engine.close()


def _split_sequences(flat: list[int]) -> list[list[int]]:
    """Stop and bad-word sequences arrive flattened, each followed by -1."""
    sequences, current = [], []
    for token in flat:
        if token == -1:
            if current:
                sequences.append(current)
            current = []
        else:
            current.append(int(token))
    if current:
        sequences.append(current)
    return sequences


class TritonSink:
    """A request's output as decoupled responses: one per event when streaming, else one at the end."""

    def __init__(self, writer: "ResponseWriter", rid: str, sender: Any, stream: bool, names: list[str],
                 entry_index: int) -> None:
        self._writer, self._rid, self._sender, self._stream = writer, rid, sender, stream
        self._names, self._entry_index = names, entry_index
        self._emitted: list[int] = []
        self._pending_tokens: list[int] = []
        self._pending_origins: list[int] = []
        self._large = 0

    def on_output(self, tokens: list[int], origins: list[int], finish_reason: str | None = None,
                  error: str | None = None) -> None:
        self._pending_tokens += tokens
        self._pending_origins += origins
        self._large += sum(1 for o in origins if o != self._entry_index)
        if finish_reason is None and not self._stream:
            return
        if finish_reason == "error":
            self._writer.error(self._rid, self._sender, error or "generation failed")
            return
        total = len(self._emitted) + len(self._pending_tokens)
        self._writer.respond(self._rid, self._sender, {
            "output_ids": np.array(self._pending_tokens, dtype=np.int32),
            "prefix_ids": np.array(self._emitted[-PREFIX_WINDOW:], dtype=np.int32),
            "output_models": np.array([self._names[o].encode() for o in self._pending_origins], dtype=np.object_),
            "finish_reason": np.array([(finish_reason or "").encode()], dtype=np.object_),
            "large_model_share": np.array([self._large / total if total else 0.0], dtype=np.float32),
            "is_final": np.array([finish_reason is not None], dtype=bool),
        }, final=finish_reason is not None)
        self._emitted += self._pending_tokens
        self._pending_tokens, self._pending_origins = [], []


class ResponseWriter:
    """Sends responses from one thread, in order, and polls client cancellation."""

    def __init__(self, pb_utils: Any, subserver: Any, batch_dim: bool) -> None:
        self._pb, self._subserver, self._batch_dim = pb_utils, subserver, batch_dim
        self._queue: queue.Queue = queue.Queue()
        self._senders: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="responses", daemon=True)
        self._thread.start()

    def track(self, rid: str, sender: Any) -> None:
        with self._lock:
            self._senders[rid] = sender

    def untrack(self, rid: str) -> None:
        with self._lock:
            self._senders.pop(rid, None)

    def respond(self, rid: str, sender: Any, outputs: dict[str, np.ndarray], final: bool) -> None:
        self._queue.put(("data", rid, sender, outputs, final))

    def error(self, rid: str, sender: Any, message: str) -> None:
        self._queue.put(("error", rid, sender, message, True))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        last_poll = time.monotonic()
        while True:
            try:
                item = self._queue.get(timeout=CANCEL_POLL_S)
            except queue.Empty:
                item = False
            if item is None:
                return
            if item:
                self._send(*item)
            if time.monotonic() - last_poll >= CANCEL_POLL_S:  # also under load, when the queue is never empty
                self._poll_cancellation()
                last_poll = time.monotonic()

    def _send(self, kind: str, rid: str, sender: Any, body: Any, final: bool) -> None:
        pb = self._pb
        if final:
            self.untrack(rid)
        try:
            if kind == "error":
                response = pb.InferenceResponse(output_tensors=[], error=pb.TritonError(body))
            else:
                response = pb.InferenceResponse([pb.Tensor(name, array[None] if self._batch_dim else array)
                                                 for name, array in body.items()])
            sender.send(response, flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)
        except Exception:  # the client is gone; the runtime learns it from is_cancelled
            log.debug("response could not be sent", exc_info=True)

    def _poll_cancellation(self) -> None:
        with self._lock:
            senders = list(self._senders.items())
        for rid, sender in senders:
            if sender.is_cancelled():
                self.untrack(rid)
                self._subserver.cancel(rid)
