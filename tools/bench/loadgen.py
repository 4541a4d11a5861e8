"""Closed-loop load: N clients, each sends its next request as soon as its last one ended.

The measurement window opens after a warm-up and closes ``measure_s`` later; clients stop
sending at its end and the target cuts what is still running, so the window always has N
requests in flight (throughput = tokens that arrived in it / its length).

``lockstep`` makes static batches instead (the official R2R code's way): all N clients start
their requests together and the next batch starts only when every request of this one ended.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from .records import RequestRecord, Window
from .targets import Spans, Target
from .workloads import PromptSource, Session, Workload


@dataclass
class LoadResult:
    records: list[RequestRecord]
    window: Window
    spans: Spans


def request_seed(seed: int, client: int, index: int) -> int:
    """A distinct sampling/routing seed for every request of a run."""
    return seed * 1_000_000 + client * 10_000 + index


def run_closed_loop(target: Target, workload: Workload, source: PromptSource, *, clients: int, warmup_s: float,
                    measure_s: float, seed: int = 0, lockstep: bool = False) -> LoadResult:
    start = time.monotonic()
    window = Window(start + warmup_s, start + warmup_s + measure_s)
    records: list[RequestRecord] = []
    failures: list[BaseException] = []
    lock = threading.Lock()
    rounds = {"go": True}

    def decide() -> None:  # runs once per static batch, while every client waits at the barrier
        rounds["go"] = time.monotonic() < window.end

    barrier = threading.Barrier(clients, action=decide) if lockstep else None

    def client(index: int) -> None:
        session = Session(workload, source, seed, index)
        previous: RequestRecord | None = None
        count = 0
        try:
            while True:
                if barrier is not None:
                    barrier.wait()
                    if not rounds["go"]:
                        return
                elif time.monotonic() >= window.end:
                    return
                record = target.generate(session.next_prompt(previous), max_tokens=workload.max_tokens,
                                         seed=request_seed(seed, index, count), deadline=window.end)
                record.client = index
                with lock:
                    records.append(record)
                previous, count = record, count + 1
        except threading.BrokenBarrierError:
            return  # another client failed; its error is reported
        except BaseException as exc:  # noqa: BLE001  (re-raised in the caller's thread)
            failures.append(exc)
            if barrier is not None:
                barrier.abort()

    threads = [threading.Thread(target=client, args=(i,), name=f"bench-client-{i}", daemon=True)
               for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return LoadResult(records, window, target.step_spans())
