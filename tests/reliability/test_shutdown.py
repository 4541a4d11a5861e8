"""`tokenrouter serve` as a user runs it under SIGTERM: it listens on loopback only, lets the
streams in flight finish, refuses new ones, and leaves no process or shared-memory region behind."""

from __future__ import annotations

import concurrent.futures
import http.client
import queue
import signal
import stat
import time
from pathlib import Path

import openai
import pytest
from tritonclient.utils import InferenceServerException

from tokenrouter.client import GrpcStream, grpc_stream, inputs
from helpers.routing import PROMPTS
from helpers.launcher import descendants, launch, tiny_repository, wait_stopped
from tokenrouter.launch.shared_memory import SHM_DIR, SHM_PATTERN, shm_regions_of
from tokenrouter.launch.triton_install import TritonInstall
from tokenrouter.launch.triton_server import Ports, TritonServer

STREAMS = 16
MAX_TOKENS = 200  # with min_tokens as long: no stream of the first wave ends within the 1 s before SIGTERM


def _listening_addresses(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp writes them) with a socket listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


def _wait_until_held(ports: Ports, streams: list[concurrent.futures.Future], timeout_s: float = 60.0) -> None:
    """Until the entry subserver holds a request of each of ``streams`` (its metrics), as the launcher's
    drain reads them; a stream that ends meanwhile fails the wait with what it returned or raised."""
    reader = TritonServer(Path("."), Path("."), TritonInstall(Path("tritonserver"), Path(".")), ports, host="127.0.0.1")
    deadline = time.monotonic() + timeout_s
    while (held := reader.control.requests_held("slm") or 0) < len(streams):
        ended = [stream for stream in streams if stream.done()]
        assert not ended, f"a stream ended before SIGTERM: {ended[0].exception() or ended[0].result()}"
        assert time.monotonic() < deadline, f"{held} of {len(streams)} requests reached the entry"
        time.sleep(0.1)


def _openai_stream(port: int, seed: int) -> tuple[str, int]:
    """A streamed completion through the OpenAI server: (finish reason, completion tokens)."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0, timeout=120)
    chunks = list(client.completions.create(model="tokenrouter", prompt=PROMPTS[seed % len(PROMPTS)], seed=seed,
                                            max_tokens=MAX_TOKENS, stream=True, stream_options={"include_usage": True},
                                            extra_body={"min_tokens": MAX_TOKENS}))
    return next(c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason), \
        chunks[-1].usage.completion_tokens


def _refused_within(url: str, seconds: float) -> bool:
    """Whether a new request is refused with the shutdown reason within ``seconds``. A probe taken before
    the drain reached the front waits behind the requests in flight (max_active holds most of them in the
    queue): it is cancelled after a second and the next one sent."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        probe = GrpcStream(url)
        try:
            probe.request(inputs(text_input="x", max_tokens=2), timeout_s=1.0)
        except InferenceServerException as refused:
            assert "the server is shutting down; try again" in str(refused), refused
            return True
        except queue.Empty:  # taken, and waiting
            probe.cancel()
        finally:
            probe.close()
        time.sleep(0.1)
    return False


def test_sigterm_drains_sixteen_streams_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """Sixteen gRPC streams and two through the OpenAI server: all finish after SIGTERM, new requests
    are refused by both servers, nothing is left."""
    launcher, ports = launch("--model-repository", str(tiny_repository(tmp_path / "repo")), "--drain-timeout=60")
    url = f"127.0.0.1:{ports.grpc}"
    try:
        server_pids = descendants(launcher.pid)
        for port in (ports.http, launcher.openai_port):
            assert _listening_addresses(port) == {"0100007F"}  # 127.0.0.1 only, not 0.0.0.0
        regions = shm_regions_of(server_pids)  # only this server's: others may run on the machine
        assert regions, "the server's stubs should have shared-memory regions"
        # readable by this user only (the backend makes them 0644: any local account could read them)
        assert {stat.S_IMODE(region.stat().st_mode) for region in regions} == {0o600}
        with concurrent.futures.ThreadPoolExecutor(STREAMS + 2) as pool:
            # The OpenAI streams first and held before the gRPC ones start: on a loaded machine the OpenAI
            # clients took seconds to connect, while the gRPC streams went on and some finished meanwhile.
            openai_streams = [pool.submit(_openai_stream, launcher.openai_port, seed) for seed in range(2)]
            _wait_until_held(ports, openai_streams)
            streams = [pool.submit(grpc_stream, url, inputs(text_input=PROMPTS[i % len(PROMPTS)], stream=True,
                                                            max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS,
                                                            random_seed=i),
                                   timeout_s=120)
                       for i in range(STREAMS)]
            _wait_until_held(ports, openai_streams + streams)  # all in flight before the SIGTERM
            assert not any(s.done() for s in streams + openai_streams), "streams finished before SIGTERM"
            launcher.send_signal(signal.SIGTERM)
            # admission is closed while draining: the front refuses by state once the launcher's drain call
            # reached it (a fixed 0.5 s was not always enough on a loaded machine), the server answers (a
            # dead one would fail the connection instead)
            assert _refused_within(url, 10.0), "no new request was refused within 10 s of the SIGTERM"
            with pytest.raises(openai.APIConnectionError):  # the OpenAI server takes no new connection
                _openai_stream(launcher.openai_port, 9)
            for stream in streams:
                responses = stream.result(timeout=120)  # finished normally: not cut by the shutdown
                reason = responses[-1]["finish_reason"].reshape(-1)[0]
                produced = sum(r["output_ids"].size for r in responses)
                assert (reason, produced) == (b"length", MAX_TOKENS)  # min_tokens: no early eos
            for stream in openai_streams:
                assert stream.result(timeout=120) == ("length", MAX_TOKENS)
        assert "tokenrouter serve: drained" in wait_stopped(launcher, server_pids, 120)
        assert not regions & set(SHM_DIR.glob(SHM_PATTERN)), "shared-memory regions left behind"
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


IDLE_CLIENTS = 24


def test_sigterm_after_traffic_stops_in_seconds_while_clients_stay_connected(tmp_path: Path) -> None:
    """Nothing in flight, but the clients of 24 finished streams keep their gRPC streams open (as
    TensorRT-LLM's clients and load generators do) and one HTTP keep-alive connection idles. Triton
    2.51 keeps a front referenced by every open stream whose first request went to it, so its unload
    never finished: the drain timed out after 30 s and tritonserver then waited out its exit timeout
    for the idle clients (48-50 s in all). Now no front is unloaded: the drain ends when the fronts
    answer that none is in flight and the entry holds no request, and tritonserver is given a short
    exit timeout."""
    launcher, ports = launch("--model-repository", str(tiny_repository(tmp_path / "repo")))
    url = f"127.0.0.1:{ports.grpc}"
    streams = [GrpcStream(url) for _ in range(IDLE_CLIENTS)]
    keep_alive = http.client.HTTPConnection("127.0.0.1", ports.http, timeout=60)
    try:
        server_pids = descendants(launcher.pid)
        for i, stream in enumerate(streams):
            stream.send(inputs(text_input=PROMPTS[i % len(PROMPTS)], stream=True, max_tokens=16, min_tokens=16))
        for stream in streams:
            assert sum(reply["output_ids"].size for reply in stream.replies(timeout_s=120)) == 16
        keep_alive.request("POST", "/v2/models/tokenrouter/generate", body=b'{"text_input": "x", "max_tokens": 2}')
        assert keep_alive.getresponse().read()  # answered; the connection stays open
        started = time.monotonic()
        launcher.send_signal(signal.SIGTERM)
        output = wait_stopped(launcher, server_pids, 120)
        took = time.monotonic() - started
        print(f"SIGTERM to exit with {IDLE_CLIENTS} idle streams and a keep-alive connection: {took:.1f} s")
        assert "tokenrouter serve: drained" in output, output[-3000:]
        assert took < 15.0, f"SIGTERM with nothing in flight took {took:.1f} s:\n{output[-3000:]}"
    finally:
        keep_alive.close()
        for stream in streams:
            stream.close()
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def _outcome(stream: concurrent.futures.Future) -> bytes | str:
    """A stream's finish reason, or its error message."""
    try:
        return stream.result(timeout=60)[-1]["finish_reason"].reshape(-1)[0]
    except InferenceServerException as err:
        return str(err)


def test_requests_that_outlast_the_drain_timeout_end_with_a_clear_reason(tmp_path: Path) -> None:
    launcher, ports = launch("--model-repository", str(tiny_repository(tmp_path / "repo")), "--drain-timeout=1")
    url = f"127.0.0.1:{ports.grpc}"
    try:
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            # 1000 tokens (min_tokens: no early eos) take the tiny pair far longer than the 1 s drain
            streams = [pool.submit(grpc_stream, url, inputs(text_input=PROMPTS[i % len(PROMPTS)], stream=True,
                                                            max_tokens=1000, min_tokens=1000, random_seed=i),
                                   timeout_s=120) for i in range(6)]
            time.sleep(1.0)
            launcher.send_signal(signal.SIGTERM)
            outcomes = [_outcome(stream) for stream in streams]
        ended = [o for o in outcomes if isinstance(o, str)]
        assert len(ended) == 6, f"every stream outlasts the drain and is ended: {outcomes}"
        assert all("the server is shutting down; the request did not finish within 1 s" in o for o in ended), ended
        rest, _ = launcher.communicate(timeout=120)
        assert launcher.returncode == 0 and "drain timed out" in rest, rest[-3000:]
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
