"""Waiting on a served pipeline's metrics for requests to be held, cancelled and gone (the metrics
refresh twice a second)."""

from __future__ import annotations

import time

from helpers.routing import MAX_MODEL_LEN, metrics, wait_for_idle_pools

LONG = MAX_MODEL_LEN - 32  # tokens each request is made to write (the context's limit allows no more)
WITHIN_S = 5.0
CANCELLED = 'tokenrouter_requests_total{model="slm",reason="cancelled"}'


def assert_cancelled_and_idle(server, before: dict[str, float], count: int, since: float) -> None:
    """Within WITHIN_S of ``since``: ``count`` more cancelled requests and no model holds anything."""
    while True:
        now = metrics(server)
        cancelled = now.get(CANCELLED, 0) - before.get(CANCELLED, 0)
        busy = wait_for_idle_pools(server, timeout_s=0)
        if cancelled == count and not busy:
            return
        assert time.monotonic() - since < WITHIN_S, \
            f"after {WITHIN_S} s: {cancelled} of {count} cancelled, busy: {busy}"
        time.sleep(0.05)


def wait_until_held(server, count: int, timeout_s: float = 60.0) -> None:
    """Until the entry holds ``count`` requests, running or queued (the metrics refresh twice a second)."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = metrics(server)
        held = (now.get('tokenrouter_active_requests{model="slm"}', 0)
                + now.get('tokenrouter_queue_depth{model="slm"}', 0))
        if held == count:
            return
        assert time.monotonic() < deadline, f"the entry holds {held} requests, expected {count}"
        time.sleep(0.1)
