"""No single request delays another: every door is bounded before work.

The probes that once stalled the whole server, sent as a hostile client sends them, over gRPC
(Triton 2.51's HTTP frontend dies on bodies of 4 MB or more before any model sees them:
docs/reliability.md): 4M logit-bias ids (32 MB) and 10^6 stop ids straight to the entry subserver
(24.6 s and 4.3 s of its loop, then; now refused by their parameters, unread: the subservers are
internal), 10^6 end ids to a front (3.3 s) and to ``tensorrt_llm``, 10^6 stop ids to ``tensorrt_llm``,
4M ids to ``postprocessing`` (6.2 s to refuse). Each is refused with an error that names what is too
large, and a bystander's 8-token request through a front, sent again and again meanwhile, never
takes more than 0.5 s longer than it does alone.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.routing import PROMPTS
from reliability.hostile_probe import PROBES
from tokenrouter.client import grpc_stream, inputs

SLACK_S = 0.5
PROBE = Path(__file__).with_name("hostile_probe.py")


def _bystander(server) -> float:
    """One 8-token request through the front, start to last response (seconds)."""
    start = time.monotonic()
    replies = grpc_stream(server.grpc_url, inputs(text_input=PROMPTS[0], max_tokens=8, min_tokens=8, stream=True))
    assert sum(len(r.ids) for r in replies) == 8
    return time.monotonic() - start


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_a_huge_request_is_refused_without_delaying_a_bystander(routing_server, probe):
    """The probe from a process of its own (hostile_probe.py), bystanders from this one until it ends."""
    message = PROBES[probe][1]
    alone = statistics.median(_bystander(routing_server) for _ in range(5))
    hostile = subprocess.Popen([sys.executable, str(PROBE), probe, routing_server.grpc_url], stdout=subprocess.PIPE,
                               text=True)
    assert hostile.stdout.readline().strip() == "ready"  # its interpreter's start is not the probe's work
    beside = []
    while hostile.poll() is None or len(beside) < 3:
        beside.append(_bystander(routing_server))
    answer = json.loads(hostile.communicate(timeout=120)[0].strip())
    print(f"{probe}: refused in {answer['took']:.2f} s; bystander alone {alone * 1000:.0f} ms, beside it "
          f"max {max(beside) * 1000:.0f} ms ({len(beside)} requests)")
    assert message in answer["error"], answer["error"]
    assert max(beside) <= alone + SLACK_S, (beside, alone)
