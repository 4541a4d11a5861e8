"""`tokenrouter fleet --tiny --pools M+K` run as a user runs it, and each worker's own numbers (KV blocks
in use, requests held, tokens it computed, the instances it links and the requests pinned to each) from
its stats endpoint, read with a Dynamo client of the test's own (test_pools_e2e.py, test_entry_pool_e2e.py)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest

from helpers.launcher import children, stop
from tokenrouter import TokenRouter
from tokenrouter.fleet.launcher import fleet_environment, tiny_config
from tokenrouter.launch.free_ports import free_port

MODELS = ("slm", "llm")


class WorkerStats:
    """Each worker's stats endpoint, through a Dynamo runtime on a loop thread of the test's own."""

    def __init__(self, run_dir: Path) -> None:
        env = fleet_environment("file", run_dir)
        self._saved = {key: os.environ.get(key) for key in env if key.startswith("DYN_")}
        os.environ.update({key: value for key, value in env.items() if key.startswith("DYN_")})
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._clients = self._run(self._connect())

    async def _connect(self) -> dict[str, Any]:
        from dynamo._core import DistributedRuntime

        self._runtime = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
        clients = {}
        for model in MODELS:
            clients[model] = await self._runtime.endpoint(f"tokenrouter.{model}.stats").client()
            await clients[model].wait_for_instances()
        return clients

    def _run(self, coroutine: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def of(self, model: str, instances: list[int] | None = None) -> list[dict[str, Any]]:
        """The stats of ``instances`` (default: every registered one, in instance order)."""
        async def ask(instance: int) -> dict[str, Any]:
            stream = await self._clients[model].direct({}, instance)
            async for answer in stream:
                return answer.data()
            raise AssertionError(f"no stats from {model} instance {instance}")

        return [self._run(ask(instance)) for instance in (self.ids(model) if instances is None else instances)]

    def ids(self, model: str) -> list[int]:
        return sorted(self._clients[model].instance_ids())

    def pid(self, model: str, instance: int) -> int:
        """The process of one instance (its stats say)."""
        return self.of(model, [instance])[0]["pid"]

    def tokens(self, model: str, instances: list[int] | None = None) -> list[int]:
        return [stats["tokens_committed"] for stats in self.of(model, instances)]

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._runtime.shutdown)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class Pools:
    def __init__(self, process: subprocess.Popen, http_port: int, run_dir: Path) -> None:
        self.process, self.run_dir = process, run_dir
        self.url = f"http://127.0.0.1:{http_port}/v1"
        self.client = openai.OpenAI(base_url=self.url, api_key="unused", max_retries=0, timeout=120)
        self.stats: WorkerStats | None = None

    def wait_ready(self, timeout: float = 300.0) -> None:
        """An entry registers its model only once its link to a peer worker is up."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (self.run_dir / "launcher.log").read_text()[-3000:]
            try:
                if [m.id for m in self.client.models.list().data] == ["tokenrouter"]:
                    return
            except openai.APIError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"the pools were not ready in {timeout} s; logs in {self.run_dir}")

    def wait_linked(self, entries: int, peers: int, timeout: float = 60.0) -> None:
        """Until ``entries`` entry instances each link ``peers`` peer instances, and each peer the entries."""
        deadline = time.monotonic() + timeout
        while True:
            ends = self.stats.of("slm"), self.stats.of("llm")
            if [len(e) for e in ends] == [entries, peers] \
                    and all(len(s["linked"]["llm"]) == peers for s in ends[0]) \
                    and all(len(s["linked"]["slm"]) == entries for s in ends[1]):
                return
            assert time.monotonic() < deadline, f"the pools did not link {entries}+{peers}; logs in {self.run_dir}"
            time.sleep(0.2)

    def worker_pids(self, module: str) -> list[int]:
        return [pid for pid in children(self.process.pid)
                if f"tokenrouter.fleet.{module}" in Path(f"/proc/{pid}/cmdline").read_text()]

    def idle(self, timeout: float = 3.0, peers: list[int] | None = None,
             entries: list[int] | None = None) -> list[dict[str, Any]]:
        """The workers' stats (the entries' ``entries``, then the peers' ``peers``; default every registered
        one) once none holds a request, a KV block or a pin (or at the timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            stats = self.stats.of("slm", entries) + self.stats.of("llm", peers)
            if all(idle(s) for s in stats) or time.monotonic() > deadline:
                return stats
            time.sleep(0.05)


def idle(stats: dict[str, Any]) -> bool:
    """A worker that holds no request, no KV block and no pin."""
    return stats["kv_blocks_used"] == 0 and stats["requests_held"] == 0 \
        and all(count == 0 for pinned in stats["pinned"].values() for count in pinned.values())


def pools_fixture(split: str) -> Any:
    """A module's one deployment of ``--pools split`` (its start is the module's main cost)."""

    @pytest.fixture(scope="module")
    def pools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pools]:
        with running_pools(tmp_path_factory.mktemp("pools"), split) as pools:
            yield pools

    return pools


def reference_fixture() -> Any:
    """A module's oracle: the embedded API on the same tiny pair and config."""

    @pytest.fixture(scope="module")
    def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TokenRouter]:
        with TokenRouter.from_config(tiny_config(tmp_path_factory.mktemp("reference"))) as router:
            yield router

    return reference


@contextmanager
def running_pools(run_dir: Path, split: str) -> Iterator[Pools]:
    """``tokenrouter fleet --tiny --pools split``, ready and linked; stopped on leaving."""
    http_port = free_port()
    command = [sys.executable, "-m", "tokenrouter.launch.cli", "fleet", "--tiny", "--pools", split,
               "--http-port", str(http_port), "--run-dir", str(run_dir), "--drain-timeout", "20"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=open(run_dir / "launcher.log", "wb"))
    pools = Pools(process, http_port, run_dir)
    try:
        pools.wait_ready()
        pools.stats = WorkerStats(run_dir)
        pools.wait_linked(*(int(n) for n in split.split("+")))
        yield pools
    finally:
        if pools.stats is not None:
            pools.stats.close()
        if process.poll() is None:
            stop(process)


def completion(pools: Pools, prompt: list[int], max_tokens: int) -> tuple[list[int], list[str], Any]:
    """A greedy completion of forced tokens: its token ids, the model of each, the response."""
    response = pools.client.completions.create(
        model="tokenrouter", prompt=prompt, max_tokens=max_tokens, logprobs=0,
        extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True,
                    "nvext": {"extra_fields": ["engine_data"]}})
    tokens = [int(t.removeprefix("token_id:")) for t in response.choices[0].logprobs.tokens]
    return tokens, response.model_extra["nvext"]["engine_data"]["response_models"], response


def concurrent_completions_equal_the_embedded_api(pools: Pools, reference: TokenRouter, prompts: list[list[int]],
                                                  max_tokens: int = 20) -> list[list[str]]:
    """``prompts`` at once, each checked against the oracle (tokens and the model of each); their models."""
    results: dict[int, tuple[list[int], list[str]]] = {}

    def one(i: int) -> None:
        tokens, models, _ = completion(pools, prompts[i], max_tokens)
        results[i] = (tokens, models)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    expected = reference.generate(prompts, max_tokens=max_tokens, ignore_eos=True)
    for i, result in enumerate(expected):
        assert results.get(i) == (result.token_ids, result.models), i
    return [results[i][1] for i in range(len(prompts))]


class TokenStream:
    """A streamed greedy completion of forced tokens, read by token ids: ``until`` reads its first ones
    (a kill goes in between), ``rest`` the others and the finish reason."""

    def __init__(self, pools: Pools, prompt: list[int], max_tokens: int) -> None:
        self._chunks = iter(pools.client.completions.create(
            model="tokenrouter", prompt=prompt, max_tokens=max_tokens, logprobs=0, stream=True,
            extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True}))
        self.tokens: list[int] = []
        self.finish: str | None = None

    def until(self, count: int) -> None:
        for chunk in self._chunks:
            self._take(chunk)
            if len(self.tokens) >= count:
                return

    def rest(self) -> None:
        for chunk in self._chunks:
            self._take(chunk)

    def _take(self, chunk: Any) -> None:
        logprobs = chunk.choices[0].logprobs if chunk.choices else None
        ids = logprobs.tokens if logprobs and logprobs.tokens else []
        self.tokens += [int(t.removeprefix("token_id:")) for t in ids]
        self.finish = (chunk.choices[0].finish_reason if chunk.choices else None) or self.finish
