"""The entry of a split pair as a Dynamo ``LLMEngine``: the small model's subserver (and the policy),
registered as the served model; the large model runs in another worker (peer_worker.py) and the two
talk through Dynamo's worker-to-worker calls (pool_member.py, dynamo_channel.py).

    python -m tokenrouter.fleet.entry_engine --config C         # with peer_worker.py --config C

The engine registers with the frontend only once its link to the peer worker is up, so a listed
model can serve. A request the pair cannot serve now (the peer worker lost) is refused with the reason.
Each chunk's ``engine_data`` has ``models`` (one per token), as the replicas' engine.py sends.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

from dynamo._core import Context, DistributedRuntime
from dynamo.common.backend import EngineConfig, GenerateChunk, GenerateRequest, LLMEngine, LlmRegistration, WorkerConfig
from dynamo.common.backend.health_check import build_health_check_payload
from dynamo.common.backend.run import run
from dynamo.llm.exceptions import InvalidArgument

from ..config import load_config
from ..request_builder import RequestError, build_spec
from ..runtime.admission import ServerBusy
from ..runtime.subserver import Subserver
from .pool_member import PoolMember
from .requests import map_request
from .response_chunks import ResponseChunks
from .streamed_output import StreamedOutput
from .worker_args import add_served_model_arguments

log = logging.getLogger(__name__)
SPEC_KEYWORDS = ("max_tokens", "min_tokens", "temperature", "top_p", "top_k", "seed", "repetition_penalty",
                 "presence_penalty", "frequency_penalty", "return_log_probs")


class _Output(StreamedOutput):
    """A ClientSink fed by the subserver's loop thread; what it gets is added on Dynamo's loop, where the
    request's generator reads it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.loop = loop

    def on_output(self, tokens: list[int], origins: list[int], finish_reason: str | None = None,
                  error: str | None = None, logprobs: list[float] | None = None) -> None:
        self.loop.call_soon_threadsafe(self.add, list(tokens), list(origins),
                                       None if logprobs is None else list(logprobs), finish_reason, error)


class EntryEngine(LLMEngine):
    def __init__(self, config_path: str | Path, served_model_name: str, namespace: str,
                 model_path: str | None = None, entries: int = 1) -> None:
        self.config_path, self.served_model_name, self.namespace = Path(config_path), served_model_name, namespace
        self.config = load_config(self.config_path)
        self.model_path, self.entries = model_path, entries
        self.member: PoolMember | None = None
        self._running: dict[str, str] = {}  # Dynamo's request id -> the subserver's
        self._start = secrets.token_hex(4)  # a restarted worker's ids differ from its tombstoned old ones
        self._count = 0

    @classmethod
    async def from_args(cls, argv: list[str] | None = None) -> tuple["EntryEngine", WorkerConfig]:
        parser = argparse.ArgumentParser(prog="python -m tokenrouter.fleet.entry_engine",
                                         description="the entry (small model) of a split pair as a Dynamo worker")
        add_served_model_arguments(parser)
        parser.add_argument("--entries", type=int, default=1,
                            help="entry workers sharing the peer pool: each admits against 1/ENTRIES of a peer "
                                 "instance's KV (default 1)")
        args = parser.parse_args(argv)
        engine = cls(args.config, args.served_model_name, args.namespace, args.model_path, args.entries)
        worker = WorkerConfig(namespace=args.namespace, component="tokenrouter", endpoint="generate",
                              model_name=engine.model_folder(), served_model_name=args.served_model_name,
                              discovery_backend=os.environ.get("DYN_DISCOVERY_BACKEND", "etcd"),
                              request_plane=os.environ.get("DYN_REQUEST_PLANE", "tcp"),
                              event_plane=os.environ.get("DYN_EVENT_PLANE"), enable_kv_routing=False)
        return engine, worker

    def model_folder(self) -> str:
        folder = self.model_path or self.config.tokenizer_path or self.config.models[self.config.entry].path
        if not folder:
            raise ValueError(f"{self.config_path}: no tokenizer folder for Dynamo's frontend; pass --model-path")
        return str(folder)

    async def start(self, worker_id: int) -> EngineConfig:
        del worker_id
        # A runtime of its own for the peer endpoints and links: the worker's (DistributedRuntime.detached())
        # has no event loop to call Python handlers on.
        self._runtime = DistributedRuntime(asyncio.get_running_loop(), os.environ.get("DYN_DISCOVERY_BACKEND", "etcd"),
                                           os.environ.get("DYN_REQUEST_PLANE", "tcp"))
        runtime = self._runtime
        self.member = await PoolMember.start(self.config_path, self.config.entry, runtime, self.namespace,
                                             on_death=lambda: _exit("the entry's subserver loop died"),
                                             entries=self.entries)
        await self.member.wait_whole()
        engine = self.member.subserver.engine
        return EngineConfig(model=self.model_folder(), served_model_name=self.served_model_name,
                            llm=LlmRegistration(context_length=self.member.subserver.core.limits.max_model_len,
                                                kv_cache_block_size=engine.block_size,
                                                total_kv_blocks=engine.num_total_blocks,
                                                max_num_seqs=self.config.scheduling.max_active))

    async def health_check_payload(self) -> dict[str, Any] | None:
        return build_health_check_payload(bos_token_id=0)

    async def generate(self, request: GenerateRequest, context: Context) -> AsyncGenerator[GenerateChunk, None]:
        mapped = map_request(request)
        member = self.member
        if member is None:
            raise RuntimeError("the engine is not started")
        if (problem := member.problem()) is not None:
            raise RuntimeError(f"the pair is not whole: {problem}; try again when it is back")
        subserver = member.subserver
        output = _Output(asyncio.get_running_loop())
        self._count += 1
        # Unique across the entry pool (a peer holds every entry's requests): this worker's instance id is.
        rid = f"entry-{member.instance:x}-{self._start}-{self._count}"
        try:
            subserver.submit(rid, mapped.prompt, self._spec(subserver, len(mapped.prompt), mapped.keywords), output)
        except RequestError as exc:
            raise InvalidArgument(str(exc)) from None
        except ServerBusy as exc:
            raise RuntimeError(f"the entry is busy: {exc}") from None
        self._running[context.id()] = rid
        chunks = ResponseChunks(len(mapped.prompt), self.config.model_names, self.config.entry)
        try:
            while True:
                await output.changed.wait()
                output.changed.clear()
                finish_reason, error = output.finish_reason, output.error
                tokens, origins, logprobs = output.take()
                if not tokens and finish_reason is None:
                    continue
                yield chunks.chunk(tokens, origins, logprobs, finish_reason)
                if finish_reason == "error":
                    raise RuntimeError(error)
                if finish_reason is not None:
                    return
        finally:
            self._running.pop(context.id(), None)
            if output.finish_reason is None:  # a consumer that stops reading ends the request on every model
                subserver.cancel(rid)

    @staticmethod
    def _spec(subserver: Subserver, prompt_len: int, keywords: dict[str, Any]) -> Any:
        sent = {key: keywords[key] for key in SPEC_KEYWORDS if key in keywords}
        eos = [] if keywords.get("ignore_eos") else sorted(subserver.engine.eos_token_ids)
        end_ids = eos + [t for t in keywords.get("stop_token_ids", []) if t not in eos]
        return build_spec(prompt_len, sent, end_ids=end_ids)

    async def abort(self, context: Context) -> None:
        rid = self._running.pop(context.id(), None)
        if rid is not None and self.member is not None:
            self.member.subserver.cancel(rid)  # the entry ends it on the peer too, whether or not generate reads on

    async def cleanup(self) -> None:
        if self.member is not None:
            member, self.member = self.member, None
            await asyncio.get_running_loop().run_in_executor(None, member.close)


def _exit(why: str) -> None:
    log.critical("%s: the worker exits", why)
    os._exit(1)


if __name__ == "__main__":
    run(EntryEngine)
