"""A subserver model's Triton requests in: each gets exactly one final answer, whatever raises.

Two kinds of request reach a subserver model: a client's prompt (``input_ids`` and sampling
inputs, entry model only) and peer messages from the other subservers of this server
(``peer_message``, authenticated by the server's secret, see peer_auth.py).

The bookkeeping rule that keeps Triton alive: a response sender is registered with the writer
(which polls it for cancellation) only while the subserver owns the request. If anything raises
before the subserver took it, the sender is unregistered and answered with an error; polling a
sender whose request Triton already freed crashes tritonserver (SIGSEGV in
``TRITONBACKEND_ResponseFactoryIsCancelled``).
"""

from __future__ import annotations

import itertools
import logging
from typing import Any, Callable

import numpy as np

from ..protocol import RequestSpec, decode_batch
from ..runtime.admission import ServerBusy
from ..runtime.request import RequestError
from .bls_transport import PEER_INPUT
from .peer_auth import CONTROL_PARAMETER, REASON_PARAMETER, carries_secret, request_parameters
from .responses import ResponseWriter, TritonSink

log = logging.getLogger(__name__)



class SubserverIntake:
    def __init__(self, pb_utils: Any, subserver: Any, writer: ResponseWriter, names: list[str], secret: str,
                 on_refused_peer_call: Callable[[], None] = lambda: None) -> None:
        self._pb, self._subserver, self._writer = pb_utils, subserver, writer
        self._names, self._secret = names, secret
        self._on_refused_peer_call = on_refused_peer_call
        self._ids = itertools.count()

    def execute(self, requests: list) -> None:
        for request in requests:
            self._answer(request)

    def _answer(self, request: Any) -> None:
        try:
            sender = request.get_response_sender()
        except Exception:  # nothing to answer through; Triton ends the request itself
            log.exception("%s: a request came without a response sender", self._subserver.name)
            return
        try:
            if self._pb.get_input_tensor_by_name(request, PEER_INPUT) is not None:
                self._take_peer_messages(request)
                sender.send(flags=self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                self._submit(request, sender)
        except RequestError as exc:
            self._reject(sender, str(exc), self._pb.TritonError.INVALID_ARG)
        except ServerBusy as exc:  # the admission queue is full: the client may retry later
            self._reject(sender, str(exc), self._pb.TritonError.UNAVAILABLE)
        except Exception as exc:  # noqa: BLE001 - a bug here must cost one request, never the server
            log.exception("%s: request failed in the Triton glue", self._subserver.name)
            self._reject(sender, f"internal error: {type(exc).__name__}: {exc}", self._pb.TritonError.INTERNAL)

    def _take_peer_messages(self, request: Any) -> None:
        parameters = request_parameters(request)
        if not carries_secret(parameters, self._secret):
            self._on_refused_peer_call()
            raise RequestError(f"'{PEER_INPUT}' is for this server's own models; refused")
        if parameters.get(CONTROL_PARAMETER) == "shutdown":
            self._end_all(str(parameters.get(REASON_PARAMETER) or "the server is shutting down"))
        payload = self._pb.get_input_tensor_by_name(request, PEER_INPUT).as_numpy().reshape(-1)[0]
        for message in decode_batch(payload):
            self._subserver.deliver(message)

    def _end_all(self, reason: str) -> None:
        """The launcher stops or restarts the server: every request this model answers ends now
        with an error saying ``reason``, and the subserver drops it (freeing its KV everywhere)."""
        for rid in self._writer.end_all(reason):
            self._subserver.cancel(rid)

    def _submit(self, request: Any, sender: Any) -> None:
        if not self._subserver.is_entry:
            raise RequestError(f"'{self._subserver.name}' is not the entry model; send requests to "
                               f"'{self._subserver.entry}' or the ensemble")
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
            end_ids=[int(t) for t in self._flat(request, "end_id")],
            stop_sequences=split_sequences(self._flat(request, "stop_ids")),
            bad_sequences=split_sequences(self._flat(request, "bad_ids")),
        )
        if not spec.end_ids:
            spec.end_ids = sorted(self._subserver.engine.eos_token_ids)
        _refuse_a_fully_banned_vocabulary(spec.bad_sequences, self._subserver.engine.vocab_size)
        stream = self._scalar(request, "stream", False, bool)
        rid = f"{self._subserver.name}-{next(self._ids)}"
        sink = TritonSink(self._writer, rid, sender, stream, self._names, self._subserver.index)
        self._writer.track(rid, sender)  # before submit: the loop may answer before submit returns
        try:
            self._subserver.submit(rid, [int(t) for t in prompt.reshape(-1)], spec, sink)
        except BaseException:
            self._writer.untrack(rid)
            raise

    def _array(self, request: Any, name: str) -> np.ndarray | None:
        tensor = self._pb.get_input_tensor_by_name(request, name)
        return None if tensor is None else tensor.as_numpy()

    def _flat(self, request: Any, name: str) -> list[int]:
        array = self._array(request, name)
        return [] if array is None else array.reshape(-1).tolist()

    def _scalar(self, request: Any, name: str, default: Any, kind: type) -> Any:
        array = self._array(request, name)
        if array is None:
            return default
        if array.size != 1:
            raise RequestError(f"{name} must hold one value, got {array.size}")
        return kind(array.reshape(-1)[0])

    def _reject(self, sender: Any, message: str, code: int) -> None:
        pb = self._pb
        try:
            sender.send(pb.InferenceResponse(output_tensors=[], error=pb.TritonError(message, code)),
                        flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:  # the request was already answered (a send that raised after it went out)
            log.warning("%s: could not send the error '%s'", self._subserver.name, message, exc_info=True)


def _refuse_a_fully_banned_vocabulary(bad_sequences: list[list[int]], vocab_size: int) -> None:
    """One-token bad words that ban every token leave nothing to sample: say so instead of
    emitting something silently. (Multi-token bad words ban only in context; the runtime's
    constraint step would have to catch a position where they add up to every token.)"""
    banned = {seq[0] for seq in bad_sequences if len(seq) == 1}
    if len(banned) >= vocab_size and banned >= set(range(vocab_size)):
        raise RequestError(f"bad_words ban every one of the {vocab_size} tokens; nothing could be generated")


def split_sequences(flat: list[int]) -> list[list[int]]:
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
