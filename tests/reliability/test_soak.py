"""The long run (slow: CI skips it; `pytest -m slow -s tests/reliability/test_soak.py`): 16 users for
TOKENROUTER_SOAK_MINUTES (default 10) against `tokenrouter serve --tiny`; no request fails, and
after warm-up no process of the server grows by more than 1 MB a minute (the least-squares slope of
its RSS, sampled every SAMPLE_S: two readings alone mistake one allocator step for a trend).

Half the users keep one gRPC stream for all their requests, as load generators and TensorRT-LLM's
clients do (Triton keeps per-stream state until the client closes it), half open one per request."""

from __future__ import annotations

import os
import threading
import time

import pytest

from tokenrouter.client import GrpcStream, grpc_stream, inputs
from e2e.test_routing_server import PROMPTS
from e2e.test_serve import _launch, triton_pid
from reliability.test_bounded_work import _rss_mb
from tokenrouter.launch.processes import stub_pids

USERS = 16
WARM_UP_S = 60.0
MINUTES = float(os.environ.get("TOKENROUTER_SOAK_MINUTES", "10"))
SAMPLE_S = 10.0


def slope_mb_per_min(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) samples, in MB per minute."""
    mean_t = sum(t for t, _ in samples) / len(samples)
    mean_mb = sum(mb for _, mb in samples) / len(samples)
    spread = sum((t - mean_t) ** 2 for t, _ in samples)
    return sum((t - mean_t) * (mb - mean_mb) for t, mb in samples) / spread * 60


@pytest.mark.slow
@pytest.mark.timeout(MINUTES * 60 + 300)  # the run itself, plus start and stop (the default is 600 s)
def test_sixteen_users_for_ten_minutes_no_failure_and_flat_memory(tmp_path) -> None:
    minutes = MINUTES
    launcher, ports = _launch("--tiny", "--model-repository", str(tmp_path / "repo"))
    log: list[str] = []
    threading.Thread(target=lambda: log.extend(launcher.stdout), daemon=True).start()
    url = f"127.0.0.1:{ports.grpc}"
    server = triton_pid(launcher.pid)
    processes = {"tritonserver": server, **stub_pids(server)}
    completed, failures, stop = [0], [], threading.Event()

    def user(n: int) -> None:
        kept = GrpcStream(url) if n % 2 else None
        i = 0
        while not stop.is_set():
            arrays = inputs(text_input=PROMPTS[(n + i) % len(PROMPTS)], stream=True,
                            max_tokens=32 + (n * 7 + i) % 64, random_seed=n * 1000 + i)
            try:
                if kept is not None:
                    kept.request(arrays, timeout_s=120)
                else:
                    grpc_stream(url, arrays, timeout_s=120)
                completed[0] += 1
            except Exception as exc:  # noqa: BLE001 - counted and reported below
                failures.append(repr(exc))
            i += 1
        if kept is not None:
            kept.close()

    users = [threading.Thread(target=user, args=(n,), daemon=True) for n in range(USERS)]
    try:
        for thread in users:
            thread.start()
        time.sleep(min(WARM_UP_S, minutes * 30))
        start, rss = time.monotonic(), {name: [] for name in processes}
        end = start + max(minutes * 60 - WARM_UP_S, 3 * SAMPLE_S)
        while time.monotonic() < end:
            for name, pid in processes.items():
                rss[name].append((time.monotonic() - start, _rss_mb(pid)))
            time.sleep(SAMPLE_S)
        growth = {name: slope_mb_per_min(samples) for name, samples in rss.items()}
    finally:
        stop.set()
        for thread in users:
            thread.join(timeout=150)
        launcher.terminate()
        launcher.wait(timeout=120)
    print(f"soak: {completed[0]} completions, {len(failures)} failures, RSS slope MB/min (first -> last MB): "
          + ", ".join(f"{name} {rate:+.2f} ({rss[name][0][1]:.0f} -> {rss[name][-1][1]:.0f})"
                      for name, rate in growth.items()))
    assert not failures, failures[:5]
    assert completed[0] > USERS
    assert all(rate < 1.0 for rate in growth.values()), growth
