"""Free ports for test and benchmark servers: below the ephemeral range (where outgoing connections
take theirs), never one a listener holds, never the same one twice in a process."""

from __future__ import annotations

import random
import socket

import pytest
from tokenrouter.launch import free_ports
from tokenrouter.launch.triton_server import Ports


WINDOW = 8  # ports the tests below may pick from: four, or two slices of four


@pytest.fixture
def window(monkeypatch: pytest.MonkeyPatch) -> range:
    """Picks limited to four ports somewhere below the ephemeral range (this process's own slice of
    the range, when parallel test workers set one, left out), in a window of WINDOW ports that this
    process has not handed out and no listener holds: the session's servers hold some by now."""
    monkeypatch.delenv(free_ports.SLICE_VARIABLE, raising=False)
    lowest = next(first for first in iter(lambda: random.randrange(21000, 31000), None)
                  if not free_ports._handed_out.intersection(range(first, first + WINDOW))
                  and free_ports._bindable(range(first, first + WINDOW), "127.0.0.1"))
    monkeypatch.setattr(free_ports, "_LOWEST", lowest)
    monkeypatch.setattr(free_ports, "_highest", lambda: lowest + 3)
    return range(lowest, lowest + 4)


def test_every_port_of_a_window_is_handed_out_once_then_none(window: range) -> None:
    picked = {free_ports.free_port() for _ in window}
    assert picked == set(window)
    with pytest.raises(RuntimeError, match="no 1 adjacent free ports"):
        free_ports.free_port()


def test_a_port_a_listener_holds_is_skipped(window: range) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", window[0]))
        listener.listen()
        assert free_ports.free_port_run(3) == window[1]


def test_picks_stay_below_the_ephemeral_range() -> None:
    ephemeral_start = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    ports = [Ports.free() for _ in range(20)]
    numbers = [port for triple in ports for port in (triple.http, triple.grpc, triple.metrics)]
    assert len(set(numbers)) == len(numbers)
    assert max(numbers) < ephemeral_start


def test_parallel_workers_pick_from_disjoint_slices(window: range, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(free_ports, "_highest", lambda: window[0] + WINDOW - 1)  # two slices of four
    picked = {}
    for index in (0, 1):
        monkeypatch.setenv(free_ports.SLICE_VARIABLE, f"{index}/2")
        picked[index] = {free_ports.free_port() for _ in range(4)}
    assert picked[0] == set(range(window[0], window[0] + 4))
    assert picked[1] == set(range(window[0] + 4, window[0] + 8))


@pytest.mark.parametrize("value", ["2/2", "1", "a/b", "-1/2"])
def test_a_malformed_slice_is_refused_by_name(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(free_ports.SLICE_VARIABLE, value)
    with pytest.raises(ValueError, match=free_ports.SLICE_VARIABLE):
        free_ports.free_port()
