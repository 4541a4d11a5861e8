"""Triton model class of the front models: what clients call, under TensorRT-LLM's names.

Rendered under each client-facing name (``frontend.names``: by default ``tokenrouter``,
``ensemble`` and ``tensorrt_llm_bls``), decoupled (streaming) or unary as the repository says. A
front owns its client's request, as TensorRT-LLM's ``tensorrt_llm_bls`` does: it checks
TensorRT-LLM's whole input set and tokenizes (front_request.py, text_inputs.py), calls the entry
subserver by decoupled BLS once per generation with the token ids and sampling inputs, each call
on a thread of its own (entry_call.py), detokenizes incrementally and answers with TensorRT-LLM's
outputs plus ours (front_outputs.py). One thread sends every response and watches the senders for
cancellation, cancelling the entry's requests by the keys the front gave them (front_writer.py): an
ensemble could not, since Triton does not pass a client's cancellation on to a composing model or
a BLS request.

Parameters: ``entry`` (the entry subserver), ``tokenizer``, ``chat_template``, ``max_model_len``,
``max_input_bytes`` (as preprocessing's), the fan-out limits ``max_return_sequences``,
``max_generations`` and ``max_words``, the default of ``exclude_input_in_output``, and
``one_token_per_response`` (whether this front streams each token alone, as TensorRT-LLM does; config ``frontend``).
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from ...request_builder import RequestError
from ..cpu_sampler import CpuSampler
from ..error_codes import ERROR_CODES_PARAMETER
from ..control import ControlCall
from ..peer_auth import carries_secret, front_request_parameters, new_request_key, request_parameters, server_secret
from ..schema import CONTROL_INPUT, EXCLUDE_INPUT, ONE_TOKEN_PER_RESPONSE
from ..text.text_inputs import TextInputs
from ..text.tokenizer_stub import load_codec, model_parameters, parse_bool
from ..triton_api import InferenceRequest, ResponseSender
from .entry_call import EntryError, cancel_at_entry, stream_from_entry
from .front_outputs import GenerationOutput
from .front_request import FanOutLimits, Generation, parse_request
from .front_writer import ClientRequest, FrontWriter

log = logging.getLogger(__name__)


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        self._sampler = CpuSampler.from_env(args["model_name"])  # off unless TOKENROUTER_PROFILE names a folder
        parameters = model_parameters(args)
        codec, tokenizer_path = load_codec(args, parameters)
        self.text = TextInputs(codec, tokenizer_path, parameters)
        self.limits = FanOutLimits.from_parameters(parameters)
        self.exclude_input = parse_bool(parameters.get(EXCLUDE_INPUT, "false"))
        # what the entry is asked for each generation: one token per streamed response (TensorRT-LLM's names)
        self.entry_parameters = {ONE_TOKEN_PER_RESPONSE: "true"} \
            if parse_bool(parameters.get(ONE_TOKEN_PER_RESPONSE, "false")) else {}
        self.entry = parameters.get("entry") or ""
        if not self.entry:
            raise ValueError(f"{args['model_name']}: parameter 'entry' (the entry subserver) is empty")
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))
        self.secret = server_secret()
        self.writer = FrontWriter(pb_utils, lambda keys: cancel_at_entry(pb_utils, self.entry, self.secret, keys))
        # set by the launcher's drain call (a shutdown or a reload): new requests are refused with it
        self.draining: str | None = None

    def execute(self, requests: list) -> None:
        # Also when unary: each request is answered later through its response sender, so that
        # this call returns at once and many requests run at a time.
        for request in requests:
            self._take(request)
        return None

    def _take(self, request: InferenceRequest) -> None:
        sender = request.get_response_sender()
        parameters = request_parameters(request) or {}
        control = pb_utils.get_input_tensor_by_name(request, CONTROL_INPUT)
        if control is not None:
            self._control(sender, parameters, control.as_numpy())
            return
        coded = bool(parameters.get(ERROR_CODES_PARAMETER))
        if self.draining is not None:
            self.writer.reject(sender, self.draining, pb_utils.TritonError.UNAVAILABLE, coded)
            return
        try:
            generations = self.generations({tensor.name(): tensor.as_numpy() for tensor in request.inputs()})
        except RequestError as exc:
            self.writer.reject(sender, str(exc), pb_utils.TritonError.INVALID_ARG, coded)
            return
        except Exception as exc:  # noqa: BLE001 - a bug here must cost one request, never the server
            log.exception("a request failed in the front")
            self.writer.reject(sender, f"internal error: {type(exc).__name__}: {exc}", pb_utils.TritonError.INTERNAL,
                               coded)
            return
        keys = [new_request_key() for _ in generations]
        client = self.writer.open(sender, keys, request.requested_output_names() or None, coded, request.request_id())
        for generation, key in zip(generations, keys):
            threading.Thread(target=self._generate, args=(client, generation, key), name="generation",
                             daemon=True).start()

    def generations(self, inputs: dict[str, np.ndarray]) -> list[Generation]:
        """The request's generations, read from its inputs (raises RequestError)."""
        return parse_request(inputs, self.text, decoupled=self.decoupled, limits=self.limits,
                             exclude_input=self.exclude_input)

    def output(self, generation: Generation) -> GenerationOutput:
        """What turns the entry's chunks of ``generation`` into the client's responses."""
        return GenerationOutput(self.text.codec, generation)

    def _control(self, sender: ResponseSender, parameters: dict[str, Any], value: np.ndarray) -> None:
        """The launcher's control calls (control.py, with this server start's secret), each with a reason that
        says to retry: ``drain`` refuses every new request from now on and answers whether any is still in
        flight (the launcher asks again until none is: Triton 2.51 cannot unload a front that clients keep
        streams open to, so a drain is this state, not an unload); ``shutdown`` ends every request in flight.
        Without the secret the input is not even read."""
        if not carries_secret(parameters, self.secret):
            self.writer.reject(sender, f"'{CONTROL_INPUT}' is for this server's launcher; refused",
                               pb_utils.TritonError.INVALID_ARG)
            return
        try:
            call = ControlCall.read(value, accepted=("drain", "shutdown"))
        except RequestError as exc:
            self.writer.reject(sender, str(exc), pb_utils.TritonError.INVALID_ARG)
            return
        reason = call.reason or "the server is shutting down"
        if call.command == "drain":
            self.draining = reason
            self.writer.answer_drained(sender)
        else:
            self.writer.end_all(reason, pb_utils.TritonError.UNAVAILABLE, sender)

    def _generate(self, client: ClientRequest, generation: Generation, key: str) -> None:
        """One generation's BLS stream from the entry, turned into the client's outputs."""
        output = self.output(generation)
        try:
            for chunk in stream_from_entry(pb_utils, self.entry, generation.entry_inputs(), output.entry_outputs(),
                                           {**front_request_parameters(self.secret, key), **self.entry_parameters}):
                outputs = output.response(chunk)
                if outputs is not None:
                    self.writer.respond(client, outputs, last_of_generation=chunk.final)
                if chunk.final:
                    return
            raise EntryError(f"'{self.entry}' ended the stream without a final response", pb_utils.TritonError.INTERNAL)
        except EntryError as exc:
            self.writer.fail(client, str(exc), exc.code)
        except Exception as exc:  # noqa: BLE001 - a bug here must cost one request, never the server
            log.exception("a generation failed in the front")
            self.writer.fail(client, f"internal error: {type(exc).__name__}: {exc}", pb_utils.TritonError.INTERNAL)

    def finalize(self) -> None:
        self.writer.close()
        if self._sampler is not None:
            self._sampler.stop()
