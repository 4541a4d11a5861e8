"""Free ports on this machine for tests and benchmarks, picked below the kernel's ephemeral range.

A port from ``bind(port 0)`` comes from the ephemeral range, the same range the kernel takes the local
port of every outgoing connection from: between the pick and the server's own bind, any client
connecting anywhere can take it, and tritonserver then exits with "Address already in use". Below the
range only a listener can take a port. This process also never hands out the same port twice, so two
picks made before either server binds cannot collide.

Processes that pick at the same time (parallel test workers, each starting servers) each take their own
part of the range: ``TOKENROUTER_PORT_SLICE=K/N`` (set by the test suite per worker, inherited by every
process a worker starts) confines this process to the K-th of N equal parts.
"""

from __future__ import annotations

import os
import random
import socket
import threading
from pathlib import Path

_LOWEST = 20000
_HIGHEST = 32767  # Dynamo 1.6.1 reads its status port as a signed 16-bit number
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
SLICE_VARIABLE = "TOKENROUTER_PORT_SLICE"
_TRIES = 200

_handed_out: set[int] = set()
_lock = threading.Lock()


def _highest() -> int:
    """The last port below the ephemeral range (and at most _HIGHEST)."""
    try:
        ephemeral_start = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _HIGHEST
    return max(_LOWEST + 1000, min(_HIGHEST, ephemeral_start - 1))


def port_range() -> range:
    """The ports this process picks from: below the ephemeral range, within its slice if it has one."""
    lowest, highest = _LOWEST, _highest()
    part = os.environ.get(SLICE_VARIABLE)
    if not part:
        return range(lowest, highest + 1)
    try:
        index, count = (int(x) for x in part.split("/"))
    except ValueError:
        raise ValueError(f"{SLICE_VARIABLE} must be K/N (the K-th of N parts, from 0), not {part!r}") from None
    if not 0 <= index < count:
        raise ValueError(f"{SLICE_VARIABLE}={part!r}: K must be in 0..N-1")
    size = (highest + 1 - lowest) // count
    return range(lowest + index * size, lowest + (index + 1) * size)


def _bindable(ports: range, host: str) -> bool:
    sockets = [socket.socket() for _ in ports]
    try:
        for sock, port in zip(sockets, ports):
            sock.bind((host, port))
        return True
    except OSError:
        return False
    finally:
        for sock in sockets:
            sock.close()


def free_port_run(count: int, host: str = "127.0.0.1") -> int:
    """The first of ``count`` adjacent ports free right now and never handed out by this process."""
    ports = port_range()
    firsts = range(ports.start, ports.stop - count + 1)
    for first in random.Random().sample(firsts, min(_TRIES, len(firsts))):
        run = range(first, first + count)
        with _lock:
            if _handed_out.intersection(run) or not _bindable(run, host):
                continue
            _handed_out.update(run)
        return first
    raise RuntimeError(f"no {count} adjacent free ports between {ports.start} and {ports.stop - 1}")


def free_port(host: str = "127.0.0.1") -> int:
    """One port free right now and never handed out by this process."""
    return free_port_run(1, host)
