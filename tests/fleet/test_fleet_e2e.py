"""End to end through NVIDIA Dynamo's OpenAI frontend: `tokenrouter fleet --tiny --replicas 2` on
loopback (file discovery, no etcd or NATS), called with the OpenAI SDK.

One fleet for the whole file (its start is this file's cost); the last tests kill a replica and
stop the fleet, so the file runs in order."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest

from tokenrouter import TokenRouter
from tokenrouter.procfs import proc_stat
from tokenrouter.fleet.launcher import tiny_config
from tokenrouter.launch.free_ports import free_port, free_port_run
from helpers.launcher import children
from helpers.streams import streaming

pytestmark = pytest.mark.timeout(400)
PROMPT_IDS = [321, 784, 10, 67, 14, 301, 309]
REPLICAS = 2


class Fleet:
    def __init__(self, process: subprocess.Popen, http_port: int, status_ports: list[int], run_dir: Path) -> None:
        self.process, self.run_dir = process, run_dir
        self.url = f"http://127.0.0.1:{http_port}/v1"
        self.status_ports = status_ports
        self.client = openai.OpenAI(base_url=self.url, api_key="unused", max_retries=0, timeout=120)

    def worker_pids(self) -> list[int]:
        return [pid for pid in children(self.process.pid)
                if "tokenrouter.fleet.worker" in Path(f"/proc/{pid}/cmdline").read_text()]

    def metrics(self, port: int) -> dict[tuple[str, str], float]:
        """tokenrouter_* gauges of one worker: {(name, model): value}."""
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        return {(m[1], m[2]): float(m[3]) for m in
                re.finditer(r'^(tokenrouter_\w+)\{[^}]*model="(\w+)"[^}]*\} (\S+)$', text, re.M)}

    def healthy(self, port: int) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (self.run_dir / "frontend.log").read_text()[-3000:]
            if all(self.healthy(p) for p in self.status_ports) and self._models_listed():
                return
            time.sleep(0.5)
        raise TimeoutError(f"the fleet was not ready in {timeout} s; logs in {self.run_dir}")

    def _models_listed(self) -> bool:
        try:
            return [m.id for m in self.client.models.list().data] == ["tokenrouter"]
        except openai.APIError:
            return False


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    run_dir = tmp_path_factory.mktemp("fleet")
    http_port, status_base = free_port(), free_port_run(REPLICAS)
    command = [sys.executable, "-m", "tokenrouter.launch.cli", "fleet", "--tiny", "--replicas", str(REPLICAS),
               "--migration-limit", "2", "--http-port", str(http_port), "--worker-status-port", str(status_base),
               "--run-dir", str(run_dir), "--drain-timeout", "20"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=open(run_dir / "launcher.log", "wb"))
    fleet = Fleet(process, http_port, [status_base + i for i in range(REPLICAS)], run_dir)
    try:
        fleet.wait_ready()
        yield fleet
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                for pid in children(process.pid):
                    os.kill(pid, signal.SIGKILL)
                process.kill()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TokenRouter]:
    with TokenRouter.from_config(tiny_config(tmp_path_factory.mktemp("reference"))) as router:
        yield router


def test_greedy_tokens_equal_the_embedded_api(fleet, reference):
    response = fleet.client.completions.create(model="tokenrouter", prompt=PROMPT_IDS, max_tokens=16, logprobs=0,
                                               extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True})
    tokens = [int(t.removeprefix("token_id:")) for t in response.choices[0].logprobs.tokens]
    expected = reference.generate([PROMPT_IDS], max_tokens=16, ignore_eos=True)[0]
    assert tokens == expected.token_ids
    assert response.choices[0].finish_reason == "length"
    assert response.usage.completion_tokens == 16 and response.usage.prompt_tokens == len(PROMPT_IDS)


def test_chat_whole_and_streamed_agree_with_engine_data(fleet):
    messages = [{"role": "user", "content": "def add(a, b):"}]
    whole = fleet.client.chat.completions.create(model="tokenrouter", messages=messages, max_tokens=12,
                                                 extra_body={"nvext": {"extra_fields": ["engine_data"]}})
    assert whole.choices[0].message.content and whole.usage.completion_tokens <= 12
    engine_data = whole.model_extra["nvext"]["engine_data"]
    models = engine_data["response_models"]
    assert len(models) == whole.usage.completion_tokens and set(models) <= {"slm", "llm"}
    assert engine_data["large_model_share"] == models.count("llm") / len(models)
    pieces = [chunk.choices[0].delta.content or "" for chunk in fleet.client.chat.completions.create(
        model="tokenrouter", messages=messages, max_tokens=12, stream=True) if chunk.choices]
    assert "".join(pieces) == whole.choices[0].message.content


def test_seed_makes_sampling_repeatable(fleet):
    def sample(seed: int) -> str:
        return fleet.client.completions.create(model="tokenrouter", prompt="def add(a, b):", max_tokens=12,
                                               temperature=1.0, seed=seed,
                                               extra_body={"ignore_eos": True}).choices[0].text
    assert sample(5) == sample(5) != sample(6)


def test_stop_string_cuts_the_text(fleet):
    # the frontend matches stop strings itself (the engine never sees them), inside a token too; it
    # ignores them when ignore_eos is set, so this greedy text ends by length, not by an end id
    free = fleet.client.completions.create(model="tokenrouter", prompt="def add(a, b):", max_tokens=16).choices[0]
    assert free.finish_reason == "length"
    stop = free.text[5:7]
    cut = fleet.client.completions.create(model="tokenrouter", prompt="def add(a, b):", max_tokens=16,
                                          stop=[stop]).choices[0]
    assert cut.text == free.text[:free.text.index(stop)] and cut.finish_reason == "stop"


def test_logprobs_one_per_token(fleet):
    response = fleet.client.chat.completions.create(model="tokenrouter", max_tokens=6, temperature=1.0, seed=3,
                                                    messages=[{"role": "user", "content": "hi"}], logprobs=True)
    content = response.choices[0].logprobs.content
    assert len(content) == response.usage.completion_tokens and all(p.logprob <= 0 for p in content)


@pytest.mark.parametrize("extra, field", [
    ({"n": 2}, "n=2"), ({"extra_body": {"min_p": 0.5}}, "min_p"), ({"temperature": -1}, "emperature"),
    ({"logprobs": True, "top_logprobs": 5}, "logprobs=5"),
])
def test_bad_input_gets_an_openai_error_naming_the_field(fleet, extra, field):
    with pytest.raises(openai.BadRequestError) as error:
        fleet.client.chat.completions.create(model="tokenrouter", max_tokens=4,
                                             messages=[{"role": "user", "content": "hi"}], **extra)
    assert field in error.value.message
    assert fleet.client.completions.create(model="tokenrouter", prompt="x", max_tokens=2).choices[0].text is not None


def _held(fleet: Fleet) -> list[dict[tuple[str, str], float]]:
    return [fleet.metrics(port) for port in fleet.status_ports]


def test_disconnect_frees_kv_on_both_models_of_its_replica(fleet):
    with streaming(fleet.url, PROMPT_IDS, 900):  # 20 tokens: the random policy (rate 0.3) used both models
        during = _held(fleet)
    busy = [m for m in during if m[("tokenrouter_kv_blocks_used", "slm")] > 0]
    assert len(busy) == 1 and busy[0][("tokenrouter_kv_blocks_used", "llm")] > 0, during
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and any(any(m.values()) for m in _held(fleet)):
        time.sleep(0.05)
    assert all(not any(m.values()) for m in _held(fleet)), _held(fleet)


def test_both_replicas_serve(fleet):
    before = [(fleet.run_dir / f"worker-{i}.log").read_text().count("request received") for i in range(REPLICAS)]
    for _ in range(4):
        fleet.client.completions.create(model="tokenrouter", prompt="x", max_tokens=2)
    after = [(fleet.run_dir / f"worker-{i}.log").read_text().count("request received") for i in range(REPLICAS)]
    assert all(a - b >= 1 for a, b in zip(after, before)), (before, after)


def test_a_killed_replica_loses_no_request_and_is_started_again(fleet):
    with streaming(fleet.url, PROMPT_IDS, 300) as lines:
        held = _held(fleet)
        victim = next(i for i, m in enumerate(held) if m[("tokenrouter_requests_held", "slm")] > 0)
        pid = next(pid for pid in fleet.worker_pids()
                   if f"DYN_SYSTEM_PORT={fleet.status_ports[victim]}".encode()
                   in Path(f"/proc/{pid}/environ").read_bytes())
        pair = _pair_processes(pid)
        assert len(pair) == 1  # the worker runs its pair in a child process
        os.kill(pid, signal.SIGKILL)
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]" and '"finish_reason":"length"' in "".join(rest[-3:]).replace(" ", "")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _running(pair[0]):
        time.sleep(0.1)
    assert not _running(pair[0])  # the killed worker's pair went with it
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (len(fleet.worker_pids()) == REPLICAS
                                               and fleet.healthy(fleet.status_ports[victim])):
        time.sleep(0.5)
    assert len(fleet.worker_pids()) == REPLICAS and fleet.healthy(fleet.status_ports[victim])


def test_sigterm_drains_workers_then_frontend(fleet):
    workers = fleet.worker_pids()
    pairs = [child for pid in workers for child in _pair_processes(pid)]
    assert len(pairs) == REPLICAS
    fleet.process.send_signal(signal.SIGTERM)
    assert fleet.process.wait(90) == 0
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers)
    assert not any(_running(pid) for pid in pairs)
    frontend_end = (fleet.run_dir / "frontend.log").stat().st_mtime
    assert all((fleet.run_dir / f"worker-{i}.log").stat().st_mtime <= frontend_end for i in range(REPLICAS))


def _pair_processes(worker: int) -> list[int]:
    return [pid for pid in children(worker)
            if "tokenrouter.fleet.pair_host" in Path(f"/proc/{pid}/cmdline").read_text()]


def _running(pid: int) -> bool:
    """Not exited (a zombie waiting for its re-parented init to reap it has exited)."""
    return (stat := proc_stat(pid)) is not None and stat.state != "Z"
