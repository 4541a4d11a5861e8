"""Learn of a process's exit the moment it happens, for processes that are not our children (a
tritonserver's Python stubs) as well as those that are: a pidfd (Linux 5.3+) turns readable when
its process exits, so one poll() waits on all of them at once instead of a periodic /proc scan."""

from __future__ import annotations

import os
import select


class ProcessExits:
    """Named processes to watch; ``wait`` returns the names of those that have exited."""

    def __init__(self, processes: dict[str, int]) -> None:
        self._poll = select.poll()
        self._names: dict[int, str] = {}  # pidfd -> name
        self._gone: list[str] = []  # exited before they could be watched
        for name, pid in processes.items():
            self.add(name, pid)

    def add(self, name: str, pid: int) -> None:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self._gone.append(name)
            return
        self._names[fd] = name
        self._poll.register(fd, select.POLLIN)

    def wait(self, timeout_s: float) -> list[str]:
        """Block up to ``timeout_s`` until at least one watched process exits; the names of all that
        have (each is reported once, then no longer watched). [] on timeout."""
        if self._gone:
            gone, self._gone = self._gone, []
            return gone
        exited = []
        for fd, _ in self._poll.poll(max(0, int(timeout_s * 1000))):
            self._poll.unregister(fd)
            os.close(fd)
            exited.append(self._names.pop(fd))
        return exited

    def close(self) -> None:
        for fd in self._names:
            os.close(fd)
        self._names.clear()

    def __enter__(self) -> "ProcessExits":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
