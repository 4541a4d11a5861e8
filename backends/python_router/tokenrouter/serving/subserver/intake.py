"""A subserver model's Triton requests in: each gets exactly one final answer, whatever raises.

Three kinds of request reach a subserver model: a prompt (``input_ids`` and sampling inputs, entry
model only) from a front model; peer messages (``peer_message``): a link call from another subserver
of the deployment, authenticated by its sender's secret (this server start's, peer_auth.py, or the
pair secret between servers) and put in order by peer_sessions.py; and control calls (``control``,
control.py: a front's cancel, the launcher's shutdown), with the server's secret. A front names its
prompt by a key (with the secret) so that its cancel can name it: Triton does not pass a client's
cancellation on to a BLS request.

The bookkeeping rule that keeps Triton alive: a response sender is registered with the writer
(which polls it for cancellation) only while the subserver owns the request. If anything raises
before the subserver took it, the sender is unregistered and answered with an error; polling a
sender whose request Triton already freed crashes tritonserver (SIGSEGV in
``TRITONBACKEND_ResponseFactoryIsCancelled``).
"""

from __future__ import annotations

import itertools
import logging
import secrets
from dataclasses import replace
from typing import Any, Callable

import numpy as np

from ...protocol import RequestSpec, decode_batch
from ...runtime.admission import ServerBusy
from ...request_builder import RequestError, build_spec
from ..control import ControlCall
from ..peer_auth import REQUEST_KEY_PARAMETER, carries_secret, request_parameters
from ..schema import CONTROL_INPUT, NO_END_ID, ONE_TOKEN_PER_RESPONSE, PEER_INPUT, SPEC_SCALARS, split_sequences
from .peer_sessions import LinkRefused, PeerSessions
from .subserver_writer import SubserverWriter
from .triton_sink import TritonSink

log = logging.getLogger(__name__)


class NotWhole(Exception):
    """A peer server of the deployment is not connected: new requests are refused (UNAVAILABLE)."""


class SubserverIntake:
    def __init__(self, pb_utils: Any, subserver: Any, writer: SubserverWriter, names: list[str], secret: str,
                 on_refused_peer_call: Callable[[], None] = lambda: None, *, sessions: PeerSessions,
                 not_whole: Callable[[], str | None] = lambda: None) -> None:
        """``sessions``: the receiving end of the peers' links; ``not_whole()``: why the deployment
        cannot serve a request now (None: it can)."""
        self._pb, self._subserver, self._writer = pb_utils, subserver, writer
        self._names, self._secret = names, secret
        self._on_refused_peer_call = on_refused_peer_call
        self._sessions, self._not_whole = sessions, not_whole
        self._ids = itertools.count()
        # Request ids are unique across server starts: a peer on another server outlives a restart of
        # this one and ignores ids it has seen end (tombstones), which a restarted count would reuse.
        self._start = secrets.token_hex(4)

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
            if self._pb.get_input_tensor_by_name(request, CONTROL_INPUT) is not None:
                self._take_control(request)
                sender.send(flags=self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            elif self._pb.get_input_tensor_by_name(request, PEER_INPUT) is not None:
                self._take_peer_messages(request)
                sender.send(flags=self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                self._submit(request, sender)
        except RequestError as exc:
            self._reject(request, sender, str(exc), self._pb.TritonError.INVALID_ARG)
        except (ServerBusy, NotWhole) as exc:  # the queue is full, or a peer server is away: retry later
            self._reject(request, sender, str(exc), self._pb.TritonError.UNAVAILABLE)
        except Exception as exc:  # noqa: BLE001 - a bug here must cost one request, never the server
            log.exception("%s: request failed in the Triton glue", self._subserver.name)
            self._reject(request, sender, f"internal error: {type(exc).__name__}: {exc}", self._pb.TritonError.INTERNAL)

    def _take_peer_messages(self, request: Any) -> None:
        parameters = request_parameters(request) or {}

        def messages() -> list:
            return decode_batch(self._pb.get_input_tensor_by_name(request, PEER_INPUT).as_numpy().reshape(-1)[0])

        try:
            batch = self._sessions.take(parameters, messages)
        except LinkRefused:
            self._on_refused_peer_call()
            raise
        for message in batch:
            self._subserver.deliver(message)

    def _take_control(self, request: Any) -> None:
        """A front's ``cancel`` (the requests it named by their keys) or the launcher's ``shutdown``."""
        self._refuse_without_secret(request_parameters(request) or {}, CONTROL_INPUT)
        call = ControlCall.read(self._pb.get_input_tensor_by_name(request, CONTROL_INPUT).as_numpy(),
                                accepted=("cancel", "shutdown"))
        if call.command == "shutdown":
            self._end_all(call.reason or "the server is shutting down")
        else:
            for rid in self._writer.rids_of(list(call.keys)):
                self._subserver.cancel(rid)

    def _refuse_without_secret(self, parameters: dict[str, Any], what: str) -> None:
        """Calls that need this server's secret: refused (and counted) without it."""
        if not carries_secret(parameters, self._secret):
            self._on_refused_peer_call()
            raise RequestError(f"'{what}' is for this server's own models; refused")

    def _end_all(self, reason: str) -> None:
        """The launcher stops or restarts the server: every request this model answers ends now
        with an error saying ``reason``, and the subserver drops it (freeing its KV everywhere)."""
        for rid in self._writer.end_all(reason):
            self._subserver.cancel(rid)

    def _submit(self, request: Any, sender: Any) -> None:
        if not self._subserver.is_entry:
            raise RequestError(f"'{self._subserver.name}' is not the entry model; send requests to "
                               f"'{self._subserver.entry}' or a front model (e.g. 'tokenrouter')")
        problem = self._not_whole()
        if problem is not None:
            raise NotWhole(f"the deployment is not whole: {problem}; try again when it is back")
        parameters = request_parameters(request)
        if parameters is None:
            raise RequestError("the request's parameters cannot be read")
        if REQUEST_KEY_PARAMETER not in parameters:
            # Only this server's models send prompts here, each named by a key with the secret: a
            # client's token ids go to tensorrt_llm, which bounds every input as the fronts do.
            # Refused before any input is read, so that no size of request costs more than this.
            raise RequestError(f"'{self._subserver.name}' is internal to this server: send token ids to "
                               f"'tensorrt_llm' (TensorRT-LLM's core model) or text to a front (e.g. 'tokenrouter')")
        self._refuse_without_secret(parameters, REQUEST_KEY_PARAMETER)
        key = str(parameters[REQUEST_KEY_PARAMETER])
        # A front's decoupled BLS call holds one of its stub's parent-side threads (32, python
        # backend's thread-pool-size) until the first response comes; requests waiting here for
        # admission would hold them all and starve that front's own sends and cancel calls.
        # So an empty response goes out at once, from the writer (one thread sends: front_writer.py).
        self._writer.accept(sender)
        prompt = self._array(request, "input_ids")
        if prompt is None:
            raise RequestError("input_ids is required")
        if prompt.ndim > 1 and prompt.shape[0] != 1:
            raise RequestError(f"one prompt per request, got a batch of {prompt.shape[0]}")
        spec = self._spec(request, int(prompt.size))
        if spec.end_ids == [NO_END_ID]:
            spec = replace(spec, end_ids=[])
        elif not spec.end_ids:
            spec = replace(spec, end_ids=sorted(self._subserver.engine.eos_token_ids))
        _refuse_a_fully_banned_vocabulary(spec.bad_sequences, self._subserver.engine.vocab_size)
        stream = self._scalar(request, "stream", False)
        rid = f"{self._subserver.name}-{self._start}-{next(self._ids)}"
        sink = TritonSink(self._writer, rid, sender, bool(stream), self._names, self._subserver.index,
                          request.requested_output_names() or None,
                          one_token=parameters.get(ONE_TOKEN_PER_RESPONSE) in (True, "true"))
        self._writer.track(rid, sender, key)  # before submit: the loop may answer before submit returns
        try:
            self._subserver.submit(rid, [int(t) for t in prompt.reshape(-1)], spec, sink)
        except BaseException:
            self._writer.untrack(rid)
            raise

    def _spec(self, request: Any, prompt_len: int) -> RequestSpec:
        """The request's RequestSpec from the subserver inputs (schema.SPEC_SCALARS and the lists; a
        missing one takes request_builder's default); the runtime validates it at submit."""
        scalars = {name: value for name in SPEC_SCALARS if (value := self._scalar(request, name, None)) is not None}
        bias_ids, bias_weights = self._flat(request, "logit_bias_ids"), self._flat(request, "logit_bias_weights")
        if len(bias_ids) != len(bias_weights):
            raise RequestError(f"logit_bias_ids has {len(bias_ids)} ids and logit_bias_weights "
                               f"{len(bias_weights)} weights; they must pair up")
        return build_spec(prompt_len, scalars, end_ids=[int(t) for t in self._flat(request, "end_id")],
                          stop_sequences=split_sequences(self._flat(request, "stop_ids")),
                          bad_sequences=split_sequences(self._flat(request, "bad_ids")),
                          logit_bias=zip(bias_ids, bias_weights))

    def _array(self, request: Any, name: str) -> np.ndarray | None:
        tensor = self._pb.get_input_tensor_by_name(request, name)
        return None if tensor is None else tensor.as_numpy()

    def _flat(self, request: Any, name: str) -> list[int]:
        array = self._array(request, name)
        return [] if array is None else array.reshape(-1).tolist()

    def _scalar(self, request: Any, name: str, default: Any) -> Any:
        """One value as a Python scalar (numpy's .item(): the dtype the schema declares)."""
        array = self._array(request, name)
        if array is None:
            return default
        if array.size != 1:
            raise RequestError(f"{name} must hold one value, got {array.size}")
        return array.reshape(-1)[0].item()

    def _reject(self, request: Any, sender: Any, message: str, code: int) -> None:
        """The error goes out from the writer thread, after whatever it was given for this sender
        before (a front's accepted response), never next to it from this one; to a front, as data
        (error_codes.py)."""
        parameters = request_parameters(request) or {}
        to_front = REQUEST_KEY_PARAMETER in parameters and carries_secret(parameters, self._secret)
        self._writer.error("", sender, message, code, in_band=to_front)


def _refuse_a_fully_banned_vocabulary(bad_sequences: list[list[int]], vocab_size: int) -> None:
    """One-token bad words that ban every token leave nothing to sample: say so instead of
    emitting something silently. (Multi-token bad words ban only in context; the runtime's
    constraint step would have to catch a position where they add up to every token.)"""
    banned = {seq[0] for seq in bad_sequences if len(seq) == 1}
    if len(banned) >= vocab_size and banned >= set(range(vocab_size)):
        raise RequestError(f"bad_words ban every one of the {vocab_size} tokens; nothing could be generated")

