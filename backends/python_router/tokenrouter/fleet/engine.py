"""The embedded runtime (every model of a config) as a Dynamo ``LLMEngine``.

One Dynamo worker is one whole pair: its frontend tokenizes, applies the chat template and stop
strings and detokenizes; this engine submits each request to the pair, which runs in a child process
(``pair_process``: not under this process's interpreter lock, which Dynamo's bridge holds), streams
token chunks back and ends with the finish reason and usage. ``engine_data`` (a client asks for it
with ``nvext.extra_fields: ["engine_data"]``) has each chunk's ``models`` (one per token) and, on the
last chunk, ``response_models`` (every token's: the frontend keeps only the last chunk's engine_data
in a whole response) and ``large_model_share``. A client that goes away reaches
``abort``, which cancels the request at the entry, and the entry ends it on every model.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncGenerator, Callable, Iterator
from pathlib import Path
from typing import Any

from dynamo._core import Context
from dynamo.common.backend import EngineConfig, GenerateChunk, GenerateRequest, LLMEngine, LlmRegistration, WorkerConfig
from dynamo.common.backend.health_check import build_health_check_payload
from dynamo.common.backend.metrics import register_engine_registry
from dynamo.llm.exceptions import InvalidArgument
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..config import SchedulingSpec, load_config
from .pair_process import PairProcess, PairStream
from .requests import map_request
from .response_chunks import ResponseChunks
from .worker_args import add_served_model_arguments

log = logging.getLogger(__name__)


class TokenRouterEngine(LLMEngine):
    def __init__(self, config_path: str | Path, served_model_name: str, model_path: str | None = None) -> None:
        self.config_path = Path(config_path)
        self.served_model_name = served_model_name
        self.model_path = model_path
        self.router: PairProcess | None = None
        self._running: dict[str, PairStream] = {}  # Dynamo's request id -> its output

    @classmethod
    async def from_args(cls, argv: list[str] | None = None) -> tuple["TokenRouterEngine", WorkerConfig]:
        parser = argparse.ArgumentParser(prog="python -m tokenrouter.fleet.worker",
                                         description="one replica of the pair as a Dynamo worker")
        add_served_model_arguments(parser)
        parser.add_argument("--discovery-backend", default=os.environ.get("DYN_DISCOVERY_BACKEND", "etcd"))
        parser.add_argument("--request-plane", default=os.environ.get("DYN_REQUEST_PLANE", "tcp"))
        parser.add_argument("--event-plane", default=os.environ.get("DYN_EVENT_PLANE"))
        args = parser.parse_args(argv)
        engine = cls(args.config, args.served_model_name, args.model_path)
        worker = WorkerConfig(namespace=args.namespace, component="tokenrouter", endpoint="generate",
                              model_name=engine.model_folder(), served_model_name=args.served_model_name,
                              discovery_backend=args.discovery_backend, request_plane=args.request_plane,
                              event_plane=args.event_plane, enable_kv_routing=False)
        return engine, worker

    def model_folder(self) -> str:
        if self.model_path:
            return self.model_path
        config = load_config(self.config_path)
        folder = config.tokenizer_path or config.models[config.entry].path
        if not folder:
            raise ValueError(f"{self.config_path}: no tokenizer folder for Dynamo's frontend; pass --model-path")
        return str(folder)

    async def start(self, worker_id: int) -> EngineConfig:
        del worker_id
        # Building engines loads weights: off the event loop, which serves Dynamo's runtime meanwhile.
        self.router = await PairProcess.start(self.config_path, on_lost=_exit_without_pair)
        return EngineConfig(model=self.model_folder(), served_model_name=self.served_model_name,
                            llm=LlmRegistration(context_length=self.router.max_model_len,
                                                kv_cache_block_size=self.router.block_size,
                                                total_kv_blocks=self.router.num_total_blocks,
                                                max_num_seqs=self.router.config.scheduling.max_active))

    async def register_prometheus(self, metrics: Any) -> None:
        """Each model's KV blocks and held requests on the worker's /metrics (DYN_SYSTEM_PORT), read at
        scrape time: what an operator (and the fleet's tests) look at to see a replica's load and leaks."""
        registry = CollectorRegistry()
        registry.register(_PairCollector(lambda: self.router))
        register_engine_registry(metrics, registry, prefix_filters=["tokenrouter_"])

    async def health_check_payload(self) -> dict[str, Any] | None:
        # One token of the vocabulary, one output token: a probe that runs every model's loop it reaches.
        return build_health_check_payload(bos_token_id=0)

    async def generate(self, request: GenerateRequest, context: Context) -> AsyncGenerator[GenerateChunk, None]:
        mapped = map_request(request)
        if (router := self.router) is None:
            raise RuntimeError("the engine is not started")
        chunks = ResponseChunks(len(mapped.prompt), router.config.model_names, router.config.entry)
        stream = router.submit(mapped.prompt, mapped.keywords)
        rid = context.id()
        self._running[rid] = stream
        try:
            while True:
                await stream.changed.wait()
                stream.changed.clear()
                if stream.aborted:
                    yield chunks.chunk([], [], None, "cancelled")
                    return
                if stream.refusal is not None:
                    raise _refusal_error(*stream.refusal)
                tokens, token_origins, logprobs = stream.take()
                finish_reason = stream.finish_reason
                if not tokens and finish_reason is None:
                    continue
                yield chunks.chunk(tokens, token_origins, logprobs, finish_reason)
                if finish_reason == "error":
                    raise RuntimeError(stream.error)
                if finish_reason is not None:
                    return
                # Paced: each response costs this process's event loop, Dynamo's request plane and the
                # frontend the same however many tokens it carries. The end is never held.
                if (interval := self._pace(router.config.scheduling)) > 0:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(interval):
                            await stream.ended.wait()
        finally:
            self._running.pop(rid, None)
            if not stream.done:  # a consumer that stops reading ends the request too
                router.cancel(stream)

    def _pace(self, scheduling: SchedulingSpec) -> float:
        """Seconds between a stream's responses: the live streams share ``scheduling.max_responses_per_s``,
        as the served entry's do (with few streams this is below a step, and every token leaves alone)."""
        return len(self._running) / scheduling.max_responses_per_s

    async def abort(self, context: Context) -> None:
        stream = self._running.pop(context.id(), None)
        if stream is not None and self.router is not None:
            self.router.cancel(stream)  # frees its KV on every model now, whether or not generate reads on
            stream.abort()

    async def cleanup(self) -> None:
        if self.router is not None:
            router, self.router = self.router, None
            await router.close()


def _refusal_error(kind: str, message: str) -> Exception:
    if kind == "invalid":  # bad input found at submit: the client's 400
        return InvalidArgument(message)
    if kind == "busy":
        return RuntimeError(f"the replica is busy: {message}")
    return RuntimeError(message)


def _exit_without_pair(why: str) -> None:
    """A worker whose pair is gone cannot serve: exit, so that the launcher starts a new one and Dynamo
    migrates (or fails) what this one held."""
    log.critical("%s: the worker exits", why)
    os._exit(1)


class _PairCollector(Collector):
    def __init__(self, router: Callable[[], PairProcess | None]) -> None:
        self._router = router

    def collect(self) -> Iterator[GaugeMetricFamily]:
        router = self._router()
        kv = GaugeMetricFamily("tokenrouter_kv_blocks_used", "KV blocks in use, per model", labels=["model"])
        held = GaugeMetricFamily("tokenrouter_requests_held", "requests a model holds (running or pending)",
                                 labels=["model"])
        if router is not None:
            for model, blocks in router.kv_blocks_used().items():
                kv.add_metric([model], blocks)
            for model, count in router.held_requests().items():
                held.add_metric([model], count)
        yield kv
        yield held
