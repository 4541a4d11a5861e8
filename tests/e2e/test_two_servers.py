"""One model per Triton server (placement.py): two tritonservers on loopback, `slm` (the entry, with
the fronts) on one and `llm` on the other, peer messages over the gRPC links (peer_link.py).

The routed tokens equal one server's and the embedded runtime's; killing either server ends the
requests that needed it with a clear error in bounded time, frees the KV the other server held for
them, shows in the connected gauge and in refusals of new requests, and heals when the server is
back; a server with another deployment is refused, naming the value; cancellation reaches both.
"""

from __future__ import annotations

import concurrent.futures
import os
import queue
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tokenrouter import TokenRouter
from tokenrouter.client import GrpcStream, inputs
from tokenrouter.config import TokenRouterConfig, load_config
from tokenrouter.launch.triton_install import find_triton
from tokenrouter.launch.triton_server import Ports, TritonServer
from tokenrouter.serving.pair_secret import PAIR_SECRET_ENV, PAIR_SECRET_FILE_ENV
from tokenrouter.serving.schema import PEER_INPUT
from tokenrouter.serving.subserver.peer_sessions import LINK_PARAMETER, LINK_SECRET_PARAMETER

from tokenrouter_tools.bench.placed import LoopbackNodes, free_ports, on_loopback

from helpers.routing import MAX_MODEL_LEN, PROMPTS, metrics, routing_config, stream_ids, wait_for_idle_pools

WITHIN_S = 3.0  # transport.down_after_s is 1 s; the rest is a loaded machine's slack (the run shows the times)
LONG = MAX_MODEL_LEN - 32
CONNECTED = 'tokenrouter_peer_connected{{model="{model}",peer="{peer}"}}'


@pytest.fixture(scope="module")
def ports() -> dict[str, Ports]:
    return dict(zip(("slm", "llm"), free_ports(2)))


@pytest.fixture(scope="module")
def config(tiny_pair, ports) -> TokenRouterConfig:
    return on_loopback(load_config(routing_config(tiny_pair)), ports)


@pytest.fixture(scope="module", autouse=True)
def pair_secret_file(tmp_path_factory):
    """Both servers inherit it from this process's environment, as `tokenrouter serve` passes it on."""
    path = tmp_path_factory.mktemp("secret") / "pair-secret"
    path.write_text("a-secret-the-two-servers-share\n")
    previous = os.environ.get(PAIR_SECRET_FILE_ENV)
    os.environ[PAIR_SECRET_FILE_ENV] = str(path)
    yield
    if previous is None:
        del os.environ[PAIR_SECRET_FILE_ENV]
    else:
        os.environ[PAIR_SECRET_FILE_ENV] = previous


def wait_connected(nodes: LoopbackNodes, model: str, peer: str, value: float, timeout_s: float = 30.0) -> None:
    key = CONNECTED.format(model=model, peer=peer)
    deadline = time.monotonic() + timeout_s
    while metrics(nodes.servers[model]).get(key) != value:
        assert time.monotonic() < deadline, f"{key} never became {value}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def deployment(config, ports, backend_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("two-servers")
    log = (folder / "servers.log").open("a")
    nodes = LoopbackNodes(config, ports, folder, find_triton(), backend_dir,
                          log_sink=lambda line: (log.write(line + "\n"), log.flush()))
    try:
        nodes.start_all(180)
        wait_connected(nodes, "slm", "llm", 1)
        wait_connected(nodes, "llm", "slm", 1)
        yield nodes
    finally:
        nodes.stop()


@pytest.fixture(scope="module")
def embedded(config):
    with TokenRouter.from_config(config) as engine:  # in one process the placement plays no part
        yield engine


def expected(embedded, prompt: str, seed: int, max_tokens: int = 24) -> tuple[list[int], list[str], str]:
    result = embedded.generate(prompt, max_tokens=max_tokens, seed=seed)[0]
    return result.token_ids, result.models, result.finish_reason


def test_two_servers_serve_the_tokens_of_one_server_and_of_the_embedded_runtime(deployment, embedded,
                                                                               routing_server):
    """Greedy, the seeded random policy (30 % of positions to llm): the same tokens, each from the
    same model, from two servers (all prompts at once) as from one server and the embedded runtime."""
    want = {i: expected(embedded, prompt, seed=i) for i, prompt in enumerate(PROMPTS)}
    assert all("llm" in models and "slm" in models for _, models, _ in want.values())  # both models wrote
    entry = deployment.servers["slm"]
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        two = dict(zip(want, pool.map(lambda i: stream_ids(entry, PROMPTS[i], max_tokens=24, seed=i), want)))
    assert two == want
    # the suite's routing server: routing_config(tiny_pair) too, every model in one server
    assert {i: stream_ids(routing_server, PROMPTS[i], max_tokens=24, seed=i) for i in want} == want
    handoffs = metrics(entry)
    assert handoffs['tokenrouter_handoffs_total{direction="out",model="slm"}'] > 0


def long_streams(server: TritonServer, count: int) -> list[GrpcStream]:
    """``count`` streams, each with a request that cannot end on its own for many seconds, under way."""
    streams = [GrpcStream(server.grpc_url) for _ in range(count)]
    for i, stream in enumerate(streams):
        stream.send(inputs(text_input=PROMPTS[i % len(PROMPTS)], max_tokens=LONG, min_tokens=LONG, seed=i,
                           stream=True))
    for stream in streams:
        next(stream.replies(timeout_s=60))
    return streams


def ends(stream: GrpcStream) -> tuple[float, str | None]:
    """When the stream's request ended, and its error (None: it finished)."""
    try:
        for _ in stream.replies(timeout_s=30):
            pass
    except InferenceServerException as error:
        return time.monotonic(), str(error)
    return time.monotonic(), None


def wait_held(server: TritonServer, model: str, timeout_s: float = 30.0) -> None:
    """Until ``model`` keeps KV for some request (its server's metrics refresh twice a second)."""
    deadline = time.monotonic() + timeout_s
    while metrics(server).get(f'tokenrouter_kv_blocks_used{{model="{model}"}}', 0) == 0:
        assert time.monotonic() < deadline, f"{model} never held a request"
        time.sleep(0.05)


def test_cancelling_a_client_stream_frees_the_request_on_both_servers(deployment):
    entry, large = deployment.servers["slm"], deployment.servers["llm"]
    streams = long_streams(entry, 4)
    wait_held(large, "llm")  # the large model's server keeps KV for them (they visited it)
    since = time.monotonic()
    for stream in streams:
        stream.cancel()
    while wait_for_idle_pools(entry, timeout_s=0) or wait_for_idle_pools(large, timeout_s=0):
        assert time.monotonic() - since < WITHIN_S, (wait_for_idle_pools(entry, 0), wait_for_idle_pools(large, 0))
        time.sleep(0.05)


def test_killing_the_large_models_server_ends_its_requests_clearly_and_the_deployment_heals(
        deployment, embedded):
    entry = deployment.servers["slm"]
    streams = long_streams(entry, 6)
    wait_held(deployment.servers["llm"], "llm")
    killed = deployment.kill("llm")
    with concurrent.futures.ThreadPoolExecutor(len(streams)) as pool:
        ended = list(pool.map(ends, streams))
    slowest = max(at for at, _ in ended) - killed
    print(f"requests ended {slowest:.2f} s after the kill at most")
    assert slowest < WITHIN_S
    for _, error in ended:  # each says which model was lost, and where
        assert error is not None and "model 'llm' at 127.0.0.1:" in error
        assert any(word in error for word in ("is unreachable", "is not connected", "could not reach")), error
    assert wait_for_idle_pools(entry, timeout_s=5) == {}  # the entry's KV for them is free
    wait_connected(deployment, "slm", "llm", 0)
    # the link's problem is what the entry answers with; a peer back with another deployment's settings is
    # such a problem, naming the value (tests/serving/test_peer_link.py: no node restart for it here)
    with pytest.raises(InferenceServerException, match="the deployment is not whole: model 'llm'"):
        stream_ids(entry, PROMPTS[0], max_tokens=4)

    deployment.start("llm")
    wait_connected(deployment, "slm", "llm", 1)
    assert stream_ids(entry, PROMPTS[1], max_tokens=24, seed=1) == expected(embedded, PROMPTS[1], seed=1)


def test_killing_the_entrys_server_frees_the_large_models_kv_and_the_deployment_heals(deployment, embedded):
    large = deployment.servers["llm"]
    streams = long_streams(deployment.servers["slm"], 4)
    wait_held(large, "llm")
    killed = deployment.kill("slm")
    while wait_for_idle_pools(large, timeout_s=0):
        assert time.monotonic() - killed < WITHIN_S, wait_for_idle_pools(large, timeout_s=0)
        time.sleep(0.05)
    wait_connected(deployment, "llm", "slm", 0)
    for stream in streams:
        stream.close()
    entry = deployment.start("slm")
    wait_connected(deployment, "slm", "llm", 1)
    wait_connected(deployment, "llm", "slm", 1)
    assert stream_ids(entry, PROMPTS[2], max_tokens=24, seed=2) == expected(embedded, PROMPTS[2], seed=2)


def test_a_link_call_without_the_pair_secret_is_refused_and_counted(deployment):
    large = deployment.servers["llm"]
    before = metrics(large).get('tokenrouter_refused_peer_calls_total{model="llm"}', 0)
    payload = grpcclient.InferInput(PEER_INPUT, [1, 1], "BYTES")
    payload.set_data_from_numpy(np.array([[b'[{"kind": "release", "rid": "x", "sender": "slm"}]']], dtype=np.object_))
    for parameters in ({LINK_PARAMETER: "slm/forged/0"},
                       {LINK_PARAMETER: "slm/forged/1", LINK_SECRET_PARAMETER: "a-guessed-secret-of-some-length"}):
        answers: queue.Queue = queue.Queue()
        with grpcclient.InferenceServerClient(large.grpc_url) as client:
            client.start_stream(callback=lambda result, error: answers.put(error))
            client.async_stream_infer("llm", [payload], parameters=parameters, enable_empty_final_response=True)
            error = answers.get(timeout=10)
            client.stop_stream()
        assert error is not None and "without its secret; refused" in str(error)
    deadline = time.monotonic() + 5
    while metrics(large).get('tokenrouter_refused_peer_calls_total{model="llm"}', 0) < before + 2:
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_a_node_without_the_pair_secret_does_not_start(config, tmp_path, capsys, monkeypatch):
    import yaml

    from tokenrouter.launch.cli import main

    monkeypatch.delenv(PAIR_SECRET_FILE_ENV)
    monkeypatch.delenv(PAIR_SECRET_ENV, raising=False)
    path = tmp_path / "pair.yaml"
    path.write_text(yaml.safe_dump(config.model_dump()))
    assert main(["serve", "--config", str(path), "--only", "llm", "--model-repository", str(tmp_path / "r")]) == 2
    assert f"set {PAIR_SECRET_FILE_ENV} to its path" in capsys.readouterr().err
    assert load_config(path).models["llm"].server  # (the config was a placed one)
