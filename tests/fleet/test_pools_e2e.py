"""The pair split over Dynamo workers, end to end: `tokenrouter fleet --tiny --pools 1+2` on loopback
(the entry worker: small model and policy, served; two peer workers of the large model, each request
pinned to one), called through Dynamo's OpenAI frontend. Each worker's own numbers (KV blocks in use,
requests held, tokens it computed, the entry's pins) come from its stats endpoint, read here with a
Dynamo client of the test's own.

One deployment for the whole file; the last tests kill a peer worker and stop the deployment, so the
file runs in order."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from helpers.launcher import children, stop
from helpers.streams import streaming
from tokenrouter import TokenRouter
from tokenrouter.fleet.launcher import fleet_environment, tiny_config
from tokenrouter.launch.free_ports import free_port

pytestmark = pytest.mark.timeout(400)
PROMPT_IDS = [321, 784, 10, 67, 14, 301, 309]
MODELS = ("slm", "llm")
KILLED_RUN_TOKENS = 600  # long enough to be still running when its peer worker is killed


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
        return self.of(model)[self.ids(model).index(instance)]["pid"]

    def all(self) -> list[dict[str, Any]]:
        return [stats for model in MODELS for stats in self.of(model)]

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
        """The entry registers its model only once its link to the peer worker is up."""
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

    def wait_linked(self, peers: int, timeout: float = 60.0) -> None:
        """The entry registers once one instance per peer model is linked: wait for all of them."""
        deadline = time.monotonic() + timeout
        while len(self.stats.of("slm")[0]["linked"]["llm"]) < peers:
            assert time.monotonic() < deadline, f"the entry did not link {peers} peer instances; logs in {self.run_dir}"
            time.sleep(0.2)

    def worker_pids(self, module: str) -> list[int]:
        return [pid for pid in children(self.process.pid)
                if f"tokenrouter.fleet.{module}" in Path(f"/proc/{pid}/cmdline").read_text()]

    def worker_pid(self, module: str) -> int:
        return self.worker_pids(module)[0]

    def idle(self, timeout: float = 3.0, peers: list[int] | None = None) -> list[dict[str, Any]]:
        """The workers' stats (the entry's, then those of the peer ``peers``, default every registered one)
        once none holds a request or a KV block (or at the timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            stats = self.stats.of("slm") + self.stats.of("llm", peers)
            if all(s["kv_blocks_used"] == 0 and s["requests_held"] == 0 for s in stats) \
                    or time.monotonic() > deadline:
                return stats
            time.sleep(0.05)


@pytest.fixture(scope="module")
def pools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pools]:
    run_dir = tmp_path_factory.mktemp("pools")
    http_port = free_port()
    command = [sys.executable, "-m", "tokenrouter.launch.cli", "fleet", "--tiny", "--pools", "1+2",
               "--http-port", str(http_port), "--run-dir", str(run_dir), "--drain-timeout", "20"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=open(run_dir / "launcher.log", "wb"))
    pools = Pools(process, http_port, run_dir)
    try:
        pools.wait_ready()
        pools.stats = WorkerStats(run_dir)
        pools.wait_linked(2)
        yield pools
    finally:
        if pools.stats is not None:
            pools.stats.close()
        if process.poll() is None:
            stop(process)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TokenRouter]:
    with TokenRouter.from_config(tiny_config(tmp_path_factory.mktemp("reference"))) as router:
        yield router


def completion(pools: Pools, prompt: list[int], max_tokens: int) -> tuple[list[int], list[str], Any]:
    response = pools.client.completions.create(
        model="tokenrouter", prompt=prompt, max_tokens=max_tokens, logprobs=0,
        extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True,
                    "nvext": {"extra_fields": ["engine_data"]}})
    tokens = [int(t.removeprefix("token_id:")) for t in response.choices[0].logprobs.tokens]
    return tokens, response.model_extra["nvext"]["engine_data"]["response_models"], response


def test_each_peer_instance_is_linked_under_the_id_it_reports(pools):
    """The entry pins requests by the instance ids its client sees; a worker names itself (as the
    origin of its calls) by its connection id: the two must be the same number."""
    ids = pools.stats.ids("llm")
    assert len(ids) == 2 and [stats["instance"] for stats in pools.stats.of("llm")] == ids
    assert pools.stats.of("slm")[0]["linked"]["llm"] == [str(i) for i in ids]


def test_greedy_tokens_equal_the_embedded_api_and_the_large_model_ran_in_a_peer_worker(pools, reference):
    before = pools.stats.tokens("llm")
    tokens, models, response = completion(pools, PROMPT_IDS, 24)
    expected = reference.generate([PROMPT_IDS], max_tokens=24, ignore_eos=True)[0]
    assert tokens == expected.token_ids
    assert models == expected.models
    assert response.choices[0].finish_reason == "length" and response.usage.completion_tokens == 24
    grew = [b - a for a, b in zip(before, pools.stats.tokens("llm"))]
    # The handoffs crossed workers, all to one instance (the request was pinned there): it computed
    # exactly the tokens credited to the large model.
    assert models.count("llm") > 0
    assert sorted(grew) == [0, models.count("llm")], grew


def concurrent_completions_equal_the_embedded_api(pools: Pools, reference: TokenRouter,
                                                  instances: list[int] | None = None) -> list[int]:
    """Four requests at once, each checked against the oracle; the large-model tokens each instance
    computed meanwhile (all of them credited to the large model in the responses)."""
    before = pools.stats.tokens("llm", instances)
    prompts = [PROMPT_IDS, [5, 6, 7, 8], [1000, 2000, 30, 40, 50, 60], [77] * 9]
    results: dict[int, tuple[list[int], list[str]]] = {}

    def one(i: int) -> None:
        tokens, models, _ = completion(pools, prompts[i], 20)
        results[i] = (tokens, models)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    expected = reference.generate(prompts, max_tokens=20, ignore_eos=True)
    for i, result in enumerate(expected):
        assert results[i] == (result.token_ids, result.models), i
    grew = [b - a for a, b in zip(before, pools.stats.tokens("llm", instances))]
    assert sum(grew) == sum(models.count("llm") for _, models in results.values())
    return grew


def test_concurrent_requests_each_equal_the_embedded_api_and_spread_over_the_pool(pools, reference):
    grew = concurrent_completions_equal_the_embedded_api(pools, reference)
    assert all(g > 0 for g in grew), grew  # placement used both instances


def test_kv_is_back_to_zero_on_both_workers_after_finish(pools):
    completion(pools, PROMPT_IDS, 30)
    stats = pools.idle()
    assert all(s["kv_blocks_used"] == 0 and s["requests_held"] == 0 for s in stats), stats
    assert all(count == 0 for count in stats[0]["pinned"]["llm"].values()), stats[0]


def test_a_disconnect_frees_kv_on_both_workers(pools):
    with streaming(pools.url, PROMPT_IDS, 900):  # 20 tokens: the random policy (rate 0.3) used both models
        entry, peers = pools.stats.of("slm")[0], pools.stats.of("llm")
    assert entry["kv_blocks_used"] > 0 and sorted(p["kv_blocks_used"] > 0 for p in peers) == [False, True], peers
    stats = pools.idle(timeout=2.0)
    assert all(s["kv_blocks_used"] == 0 and s["requests_held"] == 0 for s in stats), stats


def test_bad_input_gets_an_openai_error_naming_the_field(pools):
    with pytest.raises(openai.BadRequestError, match="min_p"):
        pools.client.completions.create(model="tokenrouter", prompt=PROMPT_IDS, max_tokens=4,
                                        extra_body={"min_p": 0.5})
    assert pools.client.completions.create(model="tokenrouter", prompt=PROMPT_IDS, max_tokens=2).choices


def streamed_tokens(chunk: Any) -> list[int]:
    logprobs = chunk.choices[0].logprobs if chunk.choices else None
    return [int(t.removeprefix("token_id:")) for t in (logprobs.tokens if logprobs and logprobs.tokens else [])]


def test_a_killed_peer_worker_does_not_fail_its_request_it_goes_on_at_the_other_instance(pools, reference):
    """The entry holds every token of a request: when the large-model worker it is pinned to is killed
    mid-run, the request goes on at the other instance (its whole context prefilled there, as a first
    visit) and ends with exactly the embedded API's greedy tokens; then KV is back to zero on the entry
    and on the instance left, and nothing is pinned."""
    stream = pools.client.completions.create(
        model="tokenrouter", prompt=PROMPT_IDS, max_tokens=KILLED_RUN_TOKENS, logprobs=0, stream=True,
        extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True})
    chunks = iter(stream)
    tokens: list[int] = []
    for chunk in chunks:  # 20 tokens: the random policy (rate 0.3) has handed the request to its instance
        tokens += streamed_tokens(chunk)
        if len(tokens) >= 20:
            break
    pinned = pools.stats.of("slm")[0]["pinned"]["llm"]
    victim = next(int(instance) for instance, count in pinned.items() if count == 1)
    survivor = next(instance for instance in pools.stats.ids("llm") if instance != victim)
    before = pools.stats.tokens("llm", [survivor])[0]
    os.kill(pools.stats.pid("llm", victim), signal.SIGKILL)
    finish = None
    for chunk in chunks:
        tokens += streamed_tokens(chunk)
        finish = (chunk.choices[0].finish_reason if chunk.choices else None) or finish
    expected = reference.generate([PROMPT_IDS], max_tokens=KILLED_RUN_TOKENS, ignore_eos=True)[0]
    assert finish == "length" and tokens == expected.token_ids
    assert pools.stats.tokens("llm", [survivor])[0] > before  # it went on there (nothing else ran)
    stats = pools.idle(timeout=5.0, peers=[survivor])
    assert all(s["kv_blocks_used"] == 0 and s["requests_held"] == 0 for s in stats), stats
    assert all(count == 0 for count in stats[0]["pinned"]["llm"].values()), stats[0]


def test_the_restarted_peer_worker_is_linked_and_takes_new_requests(pools, reference):
    """The launcher starts the killed worker again; the entry links the new instance by itself and
    places new requests on it as on the one left. (The killed one stays in file discovery: only the
    linked instances are asked for their stats.)"""
    deadline = time.monotonic() + 120
    while len(linked := pools.stats.of("slm")[0]["linked"]["llm"]) < 2:
        assert time.monotonic() < deadline, f"the restarted peer worker was not linked; logs in {pools.run_dir}"
        time.sleep(0.5)
    grew = concurrent_completions_equal_the_embedded_api(pools, reference, [int(i) for i in linked])
    assert all(g > 0 for g in grew), grew


def test_sigterm_stops_every_worker(pools):
    workers = [pools.worker_pid("entry_engine"), *pools.worker_pids("peer_worker")]
    pools.stats.close()
    pools.stats = None
    pools.process.send_signal(signal.SIGTERM)
    assert pools.process.wait(90) == 0
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers)
