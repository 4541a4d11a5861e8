"""The long run (slow: CI skips it; `pytest -m slow tests/reliability/test_soak.py`): 16 users for
TOKENROUTER_SOAK_MINUTES (default 10) against `tokenrouter serve --tiny`; no request fails, and
after warm-up no process of the server grows by more than 1 MB a minute."""

from __future__ import annotations

import os
import threading
import time

import pytest

from tokenrouter.client import grpc_stream, inputs
from e2e.test_routing_server import PROMPTS
from e2e.test_serve import _launch, triton_pid
from reliability.test_bounded_work import _rss_mb
from tokenrouter.launch.triton_server import stub_pids

USERS = 16
WARM_UP_S = 60.0
MINUTES = float(os.environ.get("TOKENROUTER_SOAK_MINUTES", "10"))


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
        i = 0
        while not stop.is_set():
            try:
                grpc_stream(url, inputs(text_input=PROMPTS[(n + i) % len(PROMPTS)], stream=True,
                                             max_tokens=32 + (n * 7 + i) % 64, random_seed=n * 1000 + i), timeout_s=120)
                completed[0] += 1
            except Exception as exc:  # noqa: BLE001 - counted and reported below
                failures.append(repr(exc))
            i += 1

    users = [threading.Thread(target=user, args=(n,), daemon=True) for n in range(USERS)]
    try:
        for thread in users:
            thread.start()
        time.sleep(min(WARM_UP_S, minutes * 30))
        start, first = time.monotonic(), {name: _rss_mb(pid) for name, pid in processes.items()}
        time.sleep(max(minutes * 60 - (time.monotonic() - start) - WARM_UP_S, 10))
        elapsed_min = (time.monotonic() - start) / 60
        growth = {name: (_rss_mb(pid) - first[name]) / elapsed_min for name, pid in processes.items()}
    finally:
        stop.set()
        for thread in users:
            thread.join(timeout=150)
        launcher.terminate()
        launcher.wait(timeout=120)
    print(f"soak: {completed[0]} completions, {len(failures)} failures, RSS growth MB/min: "
          + ", ".join(f"{name} {rate:+.2f}" for name, rate in growth.items()))
    assert not failures, failures[:5]
    assert completed[0] > USERS
    assert all(rate < 1.0 for rate in growth.values()), growth
