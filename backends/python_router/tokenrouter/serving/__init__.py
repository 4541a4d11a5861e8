"""Serving on Triton, one folder per process: which Triton stub runs each file, and what it does there.

Imports go front -> text -> top and subserver -> top; never between front and subserver, and the
top imports none of the folders (tests/serving/test_serving_layout.py). Everything is importable
without Triton except the ``*_model`` modules and ``text/tokenizer_stub.py``, which Triton's Python
backend loads. docs/runtime.md has the same map.

front/  the front models' stubs (``tokenrouter``, ``ensemble``, ``tensorrt_llm_bls``: what clients call)
    front_model.py      TritonPythonModel   the fronts' Triton glue: parse, tokenize, one thread per
                                            generation calling the entry, answer
    front_request.py    parse_request       TensorRT-LLM's inputs -> generations (Triton-free); refusals
                                            name their input
    front_outputs.py    GenerationOutput    the entry's chunks -> TensorRT-LLM's outputs, detokenized
    front_writer.py     FrontWriter         every send on one thread; polls clients for cancellation and
                                            cancels their requests at the entry by key
    entry_call.py       stream_from_entry   the front's BLS calls to the entry subserver (a generation's
                        cancel_at_entry     stream; cancelling by key)
    core_model.py       TritonPythonModel   ``tensorrt_llm`` (its own stub): TensorRT-LLM's core model, token
                                            ids in and out, a front in all but its tensors
    core_request.py     parse_core_request  TensorRT-LLM's core inputs -> generations (Triton-free), every
                                            list bounded by its shape first
    core_outputs.py     CoreOutput          the entry's chunks -> the core model's outputs (output_ids, ...)

subserver/  the python_router backend's stubs (one per model: ``slm``, ``llm``, ...; and ``routing_policy``)
    backend_model.py    TritonPythonModel   what Triton loads as python_router/model.py; picks the model kind
    model_kinds.py      SubserverModel      a subserver: engine, runtime Subserver, writer, metrics
                        RoutingPolicyModel  the routing_policy model: carries policy and settings
    intake.py           SubserverIntake     Triton requests in (prompts, peer messages, control calls),
                                            each with exactly one final answer
    subserver_writer.py SubserverWriter     decoupled responses from one thread; polls direct clients
    pacing.py           Pacer               each stream's responses paced (max_responses_per_s)
    output_chunk.py     OutputChunk         one response's output as SUBSERVER_OUTPUTS tensors
    triton_sink.py      TritonSink          the runtime's client sink: output events -> chunks
    tracked_requests.py TrackedRequests     the senders being answered; the keys fronts named them by
    placed_transport.py PlacedTransport     the subserver's transport: a peer link per peer model
    peer_link.py        PeerLink            one direction to a peer model: its thread, which drives the
                                            sending session over a channel
    sending_session.py  SendingSession      the session protocol's sending end, thread-free: numbered
                                            batches, resend, heartbeat, reconnect, give-up; ``Channel``
    peer_sessions.py    PeerSessions        the receiving end of those links: each batch applied once, in order
    bls_channel.py      BlsChannel          a link's channel in this server: BLS calls into the peer model
    grpc_channel.py     TritonStream        a link's channel to another server: Triton's ModelStreamInfer
    metrics.py          SubserverMetrics    custom metric families on Triton's metrics port
    trt_llm_metrics.py  TrtLlmMetrics       TensorRT-LLM's nv_trt_llm_* families

text/  the standalone text models' stubs (``preprocessing``, ``postprocessing``); the fronts use it too
    preprocessing_model.py   TritonPythonModel   text -> the entry's token inputs
    postprocessing_model.py  TritonPythonModel   one entry chunk -> text_output
    tokenizer_stub.py   TokenizerModel      what the stubs that load a tokenizer share
    text_inputs.py      TextInputs          prompt, stop/bad/bias words, end ids -> token ids, bounded
    detokenize.py       chunk_text          stateless, UTF-8 safe detokenizing of streamed chunks
    entry_chunk.py      EntryChunk          the entry's response as its readers hold it; chunk_outputs
    input_limits.py     input_byte_cap      how much text and how many ids a request may carry

top  shared by the processes above (and the launcher, and clients for the schema)
    schema.py           CLIENT_INPUTS, ...  every tensor's name, dtype, dims; PEER_INPUT, CONTROL_INPUT, PREFIX_TOKENS
    peer_auth.py        server_secret       the per-start secret, request keys; private files
    control.py          ControlCall         control calls (cancel, drain, shutdown) on their own input, ``control``
    pair_secret.py      pair_secret         the secret the servers of one deployment share (several servers)
    error_codes.py      code_name           Triton error codes by name, for errors sent as data
    triton_api.py       PbUtils, ...        the Triton Python-backend API the glue uses, as Protocols (and the
                                            test fake's)
    cancel_polling.py   cancel_poll_interval  how often a writer polls its senders for cancellation
    cpu_sampler.py      CpuSampler          a stub's on-CPU stack sampling (TOKENROUTER_PROFILE)
    repository.py       render_repository   the model repository from a config, and read back by stubs
"""
