"""The long run (slow: CI skips it; `pytest -m slow -s tests/reliability/test_soak.py`): the hostile probes
first (a 20 MB prompt and test_bounded_doors.py's, three rounds), then 16 users for TOKENROUTER_SOAK_MINUTES
(default 10) against `tokenrouter serve --tiny`; no request fails, and after warm-up no process of the
server grows by more than 1 MB a minute (the least-squares slope of its RSS, sampled every SAMPLE_S:
two readings alone mistake one allocator step for a trend).

What the probes may leave in tritonserver is bounded: its private (anonymous) memory comes back to
within ANON_SLACK_MB of where it was (Triton's pool of reused gRPC request objects and glibc's rising mmap
threshold kept it: the launcher turns both off). Its shared memory does not come back: the Python
backend's region of each model grows to hold the largest request that model was sent and never shrinks
(docs/reliability.md); the second round still grows it (its free space is fragmented), the third adds
less than LAST_ROUND_MB: what stays is bounded by the requests' sizes, not their number.

Half the users keep one gRPC stream for all their requests, as load generators and TensorRT-LLM's
clients do, half open one per request (closing the kept streams gave tritonserver nothing back: nothing
is held per stream)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from tritonclient.utils import InferenceServerException

from tokenrouter.client import GrpcStream, grpc_stream, inputs
from helpers.routing import PROMPTS
from helpers.launcher import launch, rss_mb, triton_pid
from reliability import hostile_probe
from reliability.hostile_probe import PROBES
from tokenrouter.launch.processes import stub_pids

USERS = 16
WARM_UP_S = 60.0
MINUTES = float(os.environ.get("TOKENROUTER_SOAK_MINUTES", "10"))
SAMPLE_S = 10.0
PROBE_ROUNDS = 3
ANON_SLACK_MB = 16.0  # measured: +0.7 MB with the launcher's settings, +81-103 MB without one or both
LAST_ROUND_MB = 8.0  # measured: +0.1 MB (the second round: +15 MB of shared memory)


def _memory_mb(pid: int) -> dict[str, float]:
    """VmRSS and its parts (RssAnon, RssFile, RssShmem) of a process, in MB."""
    fields = {}
    for line in open(f"/proc/{pid}/status").read().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def _probe_round(url: str) -> None:
    """A 20 MB prompt, then each hostile probe once, from a process of its own (as test_bounded_doors.py sends
    them); each must be refused with test_bounded_doors.py's wording up to its first number (the limits are
    that test's repository's). The prompt first: tritonserver holds its memory for a second or two after."""
    with pytest.raises(InferenceServerException, match="limit is"):
        grpc_stream(url, inputs(text_input="def f():\n    return 1\n" * (20 * 2**20 // 22), max_tokens=4))
    for name, (_, message) in sorted(PROBES.items()):
        answer = subprocess.run([sys.executable, hostile_probe.__file__, name, url], capture_output=True, text=True,
                                timeout=200, check=True).stdout.splitlines()[-1]
        assert re.split(r"\d", message)[0] in json.loads(answer)["error"], (name, answer)


def slope_mb_per_min(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) samples, in MB per minute."""
    mean_t = sum(t for t, _ in samples) / len(samples)
    mean_mb = sum(mb for _, mb in samples) / len(samples)
    spread = sum((t - mean_t) ** 2 for t, _ in samples)
    return sum((t - mean_t) * (mb - mean_mb) for t, mb in samples) / spread * 60


@pytest.mark.slow
@pytest.mark.timeout(MINUTES * 60 + 900)  # the run, a start of up to 10 minutes (a loaded machine), probes, stop
def test_after_the_hostile_probes_sixteen_users_for_ten_minutes_no_failure_and_flat_memory(tmp_path) -> None:
    minutes = MINUTES
    launcher, ports = launch("--tiny", "--model-repository", str(tmp_path / "repo"), "--ready-timeout=600")
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
        grpc_stream(url, inputs(text_input=PROMPTS[0], max_tokens=8, stream=True))  # every model has served once
        rounds = [_memory_mb(server)]
        for _ in range(PROBE_ROUNDS):
            _probe_round(url)
            rounds.append(_memory_mb(server))
        for thread in users:
            thread.start()
        time.sleep(min(WARM_UP_S, minutes * 30))
        start, rss = time.monotonic(), {name: [] for name in processes}
        end = start + max(minutes * 60 - WARM_UP_S, 3 * SAMPLE_S)
        while time.monotonic() < end:
            for name, pid in processes.items():
                rss[name].append((time.monotonic() - start, rss_mb(pid)))
            time.sleep(SAMPLE_S)
        growth = {name: slope_mb_per_min(samples) for name, samples in rss.items()}
    finally:
        stop.set()
        for thread in users:
            if thread.is_alive():  # not started when a probe failed
                thread.join(timeout=150)
        launcher.terminate()
        launcher.wait(timeout=120)
    print("tritonserver MB (VmRSS, RssAnon, RssShmem) before the probes, then after each round: "
          + "; ".join(f"{m['VmRSS']:.1f}, {m['RssAnon']:.1f}, {m['RssShmem']:.1f}" for m in rounds))
    print(f"soak: {completed[0]} completions, {len(failures)} failures, RSS slope MB/min (first -> last MB): "
          + ", ".join(f"{name} {rate:+.2f} ({rss[name][0][1]:.0f} -> {rss[name][-1][1]:.0f})"
                      for name, rate in growth.items()))
    assert not failures, failures[:5]
    assert completed[0] > USERS
    assert all(rate < 1.0 for rate in growth.values()), growth
    assert rounds[-1]["RssAnon"] - rounds[0]["RssAnon"] < ANON_SLACK_MB, rounds
    assert rounds[-1]["VmRSS"] - rounds[-2]["VmRSS"] < LAST_ROUND_MB, rounds
