"""A rank of a tensor-parallel model killed under `tokenrouter serve`: the large model runs on vLLM at
tensor-parallel size 2 (two worker processes under its stub, one core each), every token is its
(`llm_only`), and one of its ranks is SIGKILLed while streams decode. The streams in flight end with an
error that says what died, the server stops saying it is ready within seconds (the other rank is killed,
not waited for: engine/rank_watch.py), no rank of the old server outlives it, the supervisor restarts
the server, and it serves again.

Slow: a vLLM TP-2 stub starts twice here (start, restart): 80 s on a quiet 2-core machine. On a busy
one the restart can hang in Triton's Python backend (docs/reliability.md, "A start that hangs").
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from tritonclient.utils import InferenceServerException

from helpers.launcher import launch, seconds_until_not_ready, stop, triton_pid
from helpers.routing import PROMPTS
from tokenrouter.client import grpc_stream, http_generate, inputs
from tokenrouter.launch.processes import process_alive, stub_pids
from tokenrouter.launch.serve import TINY_CONFIG, TINY_FAMILY, TINY_SEED, _with_pair
from tokenrouter.procfs import child_pids, proc_stat
from tokenrouter.serving.repository import render_repository
from tokenrouter_engines.tiny import ensure_tiny_pair

# The rank's death fails the step at once, the stub exits, the supervisor turns the server not ready.
# Before the rank watch vLLM waited 5 s for the other rank, then 4 s after a SIGTERM: 10.7 s here.
NOT_READY_WITHIN_S = 5.0
RECOVERY_S = 1200.0  # a vLLM TP-2 stub took 4-10 min to start at load 15-39 (tests/e2e/test_vllm_server.py)


def _tensor_parallel_repository(repo: Path) -> Path:
    config = _with_pair(TINY_CONFIG, ensure_tiny_pair(TINY_FAMILY, TINY_SEED))
    config.models["llm"] = config.models["llm"].model_copy(update={
        "engine": "vllm", "dtype": "float32", "block_size": 32, "threads": 1, "tensor_parallel_size": 2})
    config.policy = config.policy.model_copy(update={"name": "llm_only", "params": {}})
    return render_repository(config, repo)


def _ranks(launcher_pid: int) -> list[int]:
    """The llm stub's vLLM worker processes (one per rank)."""
    stub = stub_pids(triton_pid(launcher_pid))["llm"]
    stats = {pid: proc_stat(pid) for pid in child_pids(stub)}
    return sorted(pid for pid, stat in stats.items() if stat is not None and stat.comm.startswith("VLLM::Worker"))


@pytest.mark.slow
@pytest.mark.timeout(2 * RECOVERY_S + 300)
def test_a_killed_rank_fails_its_requests_and_the_server_serves_again(tmp_path: Path) -> None:
    launcher, ports = launch("--model-repository", str(_tensor_parallel_repository(tmp_path / "repo")),
                             f"--ready-timeout={RECOVERY_S:.0f}")
    log: list[str] = []
    threading.Thread(target=lambda: log.extend(launcher.stdout), daemon=True).start()
    grpc_url, http_url = f"127.0.0.1:{ports.grpc}", f"127.0.0.1:{ports.http}"
    try:
        ranks = _ranks(launcher.pid)
        assert len(ranks) == 2, "the llm stub does not run two tensor-parallel ranks"
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            streams = [pool.submit(grpc_stream, grpc_url, inputs(text_input=PROMPTS[i], stream=True, max_tokens=1000,
                                                                  min_tokens=1000, random_seed=i), timeout_s=300)
                       for i in range(4)]
            time.sleep(2.0)  # every stream is decoding on the large model
            assert not any(stream.done() for stream in streams), "a stream ended before the kill"
            killed_at = time.monotonic()
            os.kill(ranks[-1], signal.SIGKILL)
            not_ready = seconds_until_not_ready(f"http://{http_url}/v2/health/ready", killed_at, killed_at + 60.0)
            errors, ended = [], []
            for stream in streams:
                with pytest.raises(InferenceServerException) as error:
                    stream.result(timeout=120)
                ended.append(time.monotonic() - killed_at)
                errors.append(str(error.value))
        assert not_ready is not None and not_ready <= NOT_READY_WITHIN_S, (not_ready, "".join(log[-40:]))
        assert max(ended) <= NOT_READY_WITHIN_S, (ended, errors)
        # The clients learn what died: the rank (the step it broke), or the model's stub going down for it.
        assert all("died" in message for message in errors), errors
        assert any("tensor-parallel ranks died" in line for line in log), "".join(log[-40:])
        assert not any(process_alive(pid) for pid in ranks), "a rank outlived its stub"
        print(f"not ready {not_ready:.2f} s after the kill, requests ended within {max(ended):.2f} s; "
              f"errors: {sorted(set(errors))}", flush=True)  # now: the restart below takes minutes
        deadline = time.monotonic() + RECOVERY_S
        while not any("ready again" in line for line in log):
            assert time.monotonic() < deadline, "the server did not come back:\n" + "".join(log[-40:])
            time.sleep(0.5)
        assert len(_ranks(launcher.pid)) == 2
        reply = http_generate(http_url, {"text_input": PROMPTS[0], "max_tokens": 8})
        assert len(reply["output_ids"]) == 8, reply
        print(f"serving again {time.monotonic() - killed_at:.0f} s after the kill")
    finally:
        stop(launcher)
