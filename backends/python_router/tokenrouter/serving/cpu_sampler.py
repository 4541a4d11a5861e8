"""Where a stub's CPU goes: on-CPU stack sampling of its Python threads, on when TOKENROUTER_PROFILE is set.

Every few milliseconds the sampler reads each Python thread's own CPU clock and its current stack,
and charges the CPU that thread used since the last look to that stack. A blocked thread uses no
CPU and so weighs nothing; CPU spent in C code (Triton's IPC, numpy, the GIL hand-over) lands on
the Python line that called it. Threads that Triton's stub runs in C++ have no Python stack; the
report shows their share as the process total minus the sampled threads. The report is rewritten
every few seconds, since a stub may be killed rather than finalized.

    TOKENROUTER_PROFILE=/tmp/prof tokenrouter bench served ...  ->  /tmp/prof/<model>-<pid>.txt
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from types import FrameType

log = logging.getLogger(__name__)

ENV = "TOKENROUTER_PROFILE"
INTERVAL_S = 0.003
WRITE_EVERY_S = 5.0
TOP = 30


def _where(frame: FrameType) -> str:
    code = frame.f_code
    return f"{Path(code.co_filename).name}:{code.co_name}"


def _largest(seconds: dict[str, float], n: int | None = None) -> list[tuple[str, float]]:
    """The ``n`` biggest entries, biggest first (ties in insertion order), all of them without ``n``."""
    return sorted(seconds.items(), key=lambda item: item[1], reverse=True)[:n]


class CpuSampler:
    def __init__(self, folder: Path, label: str) -> None:
        self.path = Path(folder) / f"{label}-{os.getpid()}.txt"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.by_thread: defaultdict[str, float] = defaultdict(float)  # CPU seconds
        self.self_cpu: defaultdict[str, float] = defaultdict(float)  # innermost frame
        self.inclusive: defaultdict[str, float] = defaultdict(float)  # any frame of the stack
        self._clocks: dict[int, tuple[int, float]] = {}  # thread ident -> (cpu clock id, last reading)
        self._stop = threading.Event()
        self._started = (time.monotonic(), time.process_time())
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._thread.start()

    @classmethod
    def from_env(cls, label: str) -> "CpuSampler | None":
        folder = os.environ.get(ENV)
        return cls(Path(folder), label) if folder else None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.write()

    def _run(self) -> None:
        last_write = time.monotonic()
        while not self._stop.wait(INTERVAL_S):
            try:
                self._sample()
                if time.monotonic() - last_write >= WRITE_EVERY_S:
                    self.write()
                    last_write = time.monotonic()
            except Exception:  # a diagnostic must never take the stub down
                log.exception("cpu sampler failed; sampling stops")
                return

    def _sample(self) -> None:
        names = {t.ident: t.name for t in threading.enumerate()}
        own = threading.get_ident()
        for ident, frame in sys._current_frames().items():
            if ident == own:
                continue
            try:
                clock, before = self._clocks.get(ident) or (time.pthread_getcpuclockid(ident), None)
                now = time.clock_gettime(clock)
            except OSError:
                continue  # the thread ended between the two looks
            self._clocks[ident] = (clock, now)
            used = 0.0 if before is None else now - before
            if used <= 0:
                continue
            self.by_thread[names.get(ident, str(ident))] += used
            stack = []
            at: FrameType | None = frame
            while at is not None:
                stack.append(_where(at))
                at = at.f_back
            self.self_cpu[stack[0]] += used
            for where in set(stack):
                self.inclusive[where] += used

    def write(self) -> None:
        wall = time.monotonic() - self._started[0]
        process = time.process_time() - self._started[1]
        sampled = sum(self.by_thread.values())
        lines = [f"wall {wall:.1f} s, process CPU {process:.2f} s, sampled Python threads {sampled:.2f} s "
                 f"(the rest: threads without a Python stack, and this sampler)", "", "CPU by thread (s):"]
        lines += [f"  {seconds:8.3f}  {name}" for name, seconds in _largest(self.by_thread)]
        for title, counter in (("self CPU (innermost Python frame)", self.self_cpu),
                               ("inclusive CPU (frame anywhere on the stack)", self.inclusive)):
            lines += ["", f"{title}, top {TOP} (s, share of sampled):"]
            lines += [f"  {seconds:8.3f}  {100 * seconds / max(sampled, 1e-9):5.1f} %  {where}"
                      for where, seconds in _largest(counter, TOP)]
        self.path.write_text("\n".join(lines) + "\n")
