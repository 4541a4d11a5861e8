"""How often a response writer polls its senders for a client's cancellation: the subserver's and the front's.

Each is_cancelled() is an IPC round trip to tritonserver: polling 64 streams every 20 ms cost
3200 round trips a second, and every 0.1 s still 640, more than the responses themselves. So
each live sender is polled every CANCEL_POLL_S while few are live, and the polls of many share
MAX_CANCEL_POLLS_PER_S (64 streams: each every 0.32 s).
"""

CANCEL_POLL_S = 0.1
MAX_CANCEL_POLLS_PER_S = 200.0


def cancel_poll_interval(live: int, fastest_s: float = CANCEL_POLL_S) -> float:
    """Seconds between two cancellation polls of each of ``live`` senders."""
    return max(fastest_s, live / MAX_CANCEL_POLLS_PER_S)
