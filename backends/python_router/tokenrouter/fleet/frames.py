"""Length-prefixed pickle frames: the messages between a Dynamo worker and its pair's process
(pair_messages.py).

Both ends are our own code on one host (a socket pair made by the worker), so pickle is safe here.
"""

from __future__ import annotations

import pickle
import socket
import struct
from typing import Any, BinaryIO

HEADER = struct.Struct("!I")


def encode(message: Any) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(payload)) + payload


def decode(payload: bytes) -> Any:
    return pickle.loads(payload)


def read_frame(stream: BinaryIO) -> Any:
    """The next message from a blocking binary stream; EOFError when the other end has closed."""
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        raise EOFError("the other end closed")
    (size,) = HEADER.unpack(header)
    payload = stream.read(size)
    if len(payload) < size:
        raise EOFError("the other end closed in a message")
    return decode(payload)


class BlockingChannel:
    """Request-reply over a blocking socket (one caller at a time: the caller holds a lock)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._reader = sock.makefile("rb")

    def send(self, message: Any) -> None:
        self._sock.sendall(encode(message))

    def receive(self) -> Any:
        return read_frame(self._reader)

    def close(self) -> None:
        self._reader.close()
        self._sock.close()
