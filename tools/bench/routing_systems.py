"""The systems `tokenrouter bench-vllm routing` puts side by side, each loaded, measured and closed
on its own (the real pair's engines and the lone large model do not all fit in memory at once).

Every system takes the same requests (HumanEval chat prompts as token ids, and as the text a client
sends) and returns each request's generated token ids and how many of them the large model wrote:

- ``tokenrouter``: the embedded runtime (``TokenRouter``), each vLLM engine in a process of its own;
- ``tokenrouter_served``: the same config rendered to a model repository and served by Triton,
  ``clients`` closed-loop gRPC streams sending text as any TensorRT-LLM client does;
- ``large_alone``: the large model on vLLM's own continuous-batching loop, every core its own.
"""

from __future__ import annotations

import contextlib
import queue
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

from tokenrouter import client
from tokenrouter.config import ModelSpec, TokenRouterConfig
from tokenrouter.engine.process_engine import EngineProcess
from tokenrouter.launch.triton_install import build_backend_dir, find_triton
from tokenrouter.launch.triton_server import Ports, TritonServer, write_lines
from tokenrouter.runtime.api import TokenRouter
from tokenrouter.serving.repository import render_repository

SERVER_READY_S = 900.0  # the real pair loads in about two minutes when the machine is quiet
REPLY_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Requests:
    ids: list[list[int]]  # what the embedded runtime and vLLM take
    texts: list[str]  # what a client of the served fronts sends (tokenizes to ``ids``)
    stop_ids: list[int]
    max_tokens: int


@dataclass(frozen=True)
class Outputs:
    tokens: list[list[int]]  # per request, in request order
    large_tokens: int  # tokens written by a model other than the entry

    @property
    def total(self) -> int:
        return sum(len(t) for t in self.tokens)


Generate = Callable[[Requests], Outputs]


@contextlib.contextmanager
def embedded_tokenrouter(config: TokenRouterConfig) -> Iterator[Generate]:
    with TokenRouter(config) as system:
        def generate(requests: Requests) -> Outputs:
            results = system.generate(requests.ids, max_tokens=requests.max_tokens, timeout=3600)
            large = sum(round(r.large_model_share * len(r.token_ids)) for r in results)
            return Outputs([list(r.token_ids) for r in results], large)

        yield generate


@contextlib.contextmanager
def served_tokenrouter(config: TokenRouterConfig, clients: int, log_path: Path | None = None) -> Iterator[Generate]:
    """Triton serving ``config``; each request goes to the first front as text, greedy, streamed."""
    install = find_triton()
    with tempfile.TemporaryDirectory(prefix="bench-routing-served-") as tmp:
        repository = render_repository(config, Path(tmp) / "repository")
        log = (log_path or Path(tmp) / "server.log").open("w")
        server = TritonServer(repository, build_backend_dir(install, Path(tmp) / "backends"), install, Ports.free(),
                              host="127.0.0.1", log_sink=write_lines(log),
                              exit_timeout_s=5)
        try:
            server = server.start_ready(SERVER_READY_S)
            yield lambda requests: _closed_loop(server.grpc_url, config, requests, clients)
        finally:
            server.stop()
            log.close()


def _closed_loop(url: str, config: TokenRouterConfig, requests: Requests, clients: int) -> Outputs:
    """``clients`` threads, one kept gRPC stream each, taking the next request as they finish one."""
    entry, front = config.entry, config.frontend.names[0]
    todo: queue.Queue = queue.Queue()
    for index, text in enumerate(requests.texts):
        todo.put((index, text))
    tokens: list[list[int]] = [[] for _ in requests.texts]
    large = [0] * len(requests.texts)
    errors: list[BaseException] = []

    def run_client() -> None:
        stream = client.GrpcStream(url)
        try:
            while True:
                try:
                    index, text = todo.get_nowait()
                except queue.Empty:
                    return
                # The text is the chat turn already rendered (as the embedded run's ids): sent as is.
                stream.send(client.inputs(text_input=text, max_tokens=requests.max_tokens, stream=True,
                                          exclude_input_in_output=True, apply_chat_template=False), front,
                            outputs=("output_ids", "output_models"))
                for reply in stream.replies(REPLY_TIMEOUT_S):
                    if reply.outputs:
                        tokens[index] += reply.ids
                        large[index] += sum(model != entry for model in reply.models)
        except BaseException as error:  # noqa: BLE001  (re-raised in the caller's thread)
            errors.append(error)
        finally:
            stream.close()

    threads = [threading.Thread(target=run_client, name=f"client-{i}") for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"{len(errors)} served client(s) failed; the first: {errors[0]}") from errors[0]
    return Outputs(tokens, sum(large))


@contextlib.contextmanager
def large_alone(config: TokenRouterConfig, clients: int, cores: int) -> Iterator[Generate]:
    """The large model of ``config`` alone on vLLM's own loop, with every core (threads = cores, unpinned)."""
    name = next(n for n in config.model_names if n != config.entry)
    spec = dict(config.models[name].model_dump(), threads=cores, cpus=None, max_batch_size=clients)
    engine = EngineProcess(name, ModelSpec(**spec))
    try:
        def generate(requests: Requests) -> Outputs:
            outputs, _ = engine.call("generate_natively", requests.ids, requests.max_tokens, requests.stop_ids)
            return Outputs([list(o) for o in outputs], sum(len(o) for o in outputs))

        yield generate
    finally:
        engine.close()


def timed(generate: Generate, requests: Requests) -> tuple[float, Outputs]:
    start = time.perf_counter()
    outputs = generate(requests)
    return time.perf_counter() - start, outputs


def identical_rows(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> int:
    return sum(list(x) == list(y) for x, y in zip(a, b))
