"""A subserver loop that dies anyway (a bug) under Triton: its requests end with an error, the
server stops saying it is ready, and `tokenrouter serve` brings it back.

The bug is injected from outside the product, the way a user extends a repository: the shared
launcher's repository (helpers/supervised.py) serves `llm` through a test model.py that wraps the real
backend and makes its loop raise once a trigger file exists. Nothing in the product knows about it.
"""

from __future__ import annotations

import concurrent.futures
import time
import urllib.error
import urllib.request

import pytest
from tritonclient.utils import InferenceServerException

from helpers.routing import PROMPTS
from helpers.supervised import BREAKABLE_MODEL, READY_AGAIN_S, Supervised
from tokenrouter.client import grpc_stream, http_generate, inputs


def _ready(http_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{http_url}/v2/health/ready", timeout=1) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


def test_a_dead_loop_fails_its_requests_marks_the_server_not_ready_and_heals(
        supervised_launcher: Supervised) -> None:
    """Catches a loop that dies silently under Triton: before the stub took itself down, the
    requests failed but Triton kept the model READY and every later request reaching the model
    was refused, with no restart (the supervisor watches processes, not threads)."""
    served = supervised_launcher
    served.wait_ready()
    trigger, log, grpc_url, http_url = served.break_trigger, served.lines, served.grpc_url, served.http_url
    ready, died = served.count("ready again"), served.count(f"model {BREAKABLE_MODEL}: the subserver loop died")
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            streams = [pool.submit(grpc_stream, grpc_url, inputs(text_input=PROMPTS[i], stream=True,
                                                                  max_tokens=1000, min_tokens=1000, random_seed=i),
                                   timeout_s=120) for i in range(4)]
            time.sleep(1.0)  # every stream is decoding, and the tiny routing policy hands tokens to llm
            trigger.touch()
            broken_at = time.monotonic()
            not_ready_seen = False
            ended = []
            for stream in streams:
                try:
                    stream.result(timeout=60)
                except InferenceServerException:
                    ended.append(time.monotonic() - broken_at)
                except concurrent.futures.TimeoutError:
                    pytest.fail("a request of the dead loop never ended:\n" + "".join(log[-60:]))
                else:
                    pytest.fail("a request of the dead loop finished as if nothing had happened")
    finally:
        trigger.unlink(missing_ok=True)  # the restarted server must not break again
    deadline = time.monotonic() + READY_AGAIN_S
    while served.count("ready again") == ready:
        not_ready_seen = not_ready_seen or not _ready(http_url)
        assert time.monotonic() < deadline, "the server did not come back:\n" + "".join(log[-40:])
        time.sleep(0.1)
    assert served.count(f"model {BREAKABLE_MODEL}: the subserver loop died") > died, "".join(log[-40:])
    assert not_ready_seen, "readiness never dropped while the broken server was replaced"
    assert max(ended) < 2.0, f"requests ended {max(ended):.2f} s after the loop died"
    reply = http_generate(http_url, {"text_input": PROMPTS[0], "max_tokens": 8})
    assert len(reply["output_ids"]) == 8
    print(f"requests ended within {max(ended):.2f} s of the loop's death")
