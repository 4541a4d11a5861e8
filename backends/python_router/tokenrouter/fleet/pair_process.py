"""The Dynamo worker's side of its pair's process (``pair_host``): submit, cancel, read output, stats.

A worker that ran the embedded runtime in its own process shared one interpreter lock between Dynamo's
bridge, its event loop and both models' subserver loops; on a busy host that held a replica's throughput
well below the same pair's through Triton, where each model has a stub process. Here the pair runs in a
child process; the worker reads its output on the event loop (one message per batch of committed
tokens, no thread) and asks for stats on a second socket, synchronously.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from ..config import TokenRouterConfig, load_config
from ..pipe_messages import UnknownMessage, expect
from .frames import HEADER, BlockingChannel, decode, encode
from .pair_messages import AskStats, Cancel, Close, ControlAnswer, ControlError, Failed, Out, Ready, Stats, Submit
from .streamed_output import StreamedOutput

STOP_TIMEOUT_S = 60.0  # a closing pair finishes its loops' current steps first


class PairProcessError(RuntimeError):
    """The pair's process failed to start or exited."""


class PairStream(StreamedOutput):
    """One request's output as the pair's process sends it, read by ``generate`` on the event loop."""

    def __init__(self, key: int) -> None:
        super().__init__()
        self.key = key
        self.refusal: tuple[str, str] | None = None  # (kind, message) when the submit was refused
        self.aborted = False

    @property
    def done(self) -> bool:
        return self.ended.is_set()

    def refuse(self, kind: str, message: str) -> None:
        self.refusal = (kind, message)
        self.ended.set()
        self.changed.set()

    def abort(self) -> None:
        self.aborted = True
        self.ended.set()
        self.changed.set()


class PairProcess:
    """A config's pair in a child process; ``start`` returns once every model is loaded."""

    def __init__(self, config: TokenRouterConfig, process: subprocess.Popen, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, control: BlockingChannel, ready: Ready,
                 on_lost: Callable[[str], None]) -> None:
        self.config = config
        self.max_model_len = ready.max_model_len
        self.block_size = ready.block_size
        self.num_total_blocks = ready.num_total_blocks
        self._process = process
        self._reader, self._writer = reader, writer
        self._control, self._control_lock = control, threading.Lock()
        self._on_lost = on_lost
        self._streams: dict[int, PairStream] = {}
        self._keys = itertools.count()
        self._closing = False
        self._reading = asyncio.create_task(self._read_outputs())

    @classmethod
    async def start(cls, config_path: str | Path, on_lost: Callable[[str], None]) -> "PairProcess":
        """``on_lost(why)``: called on the event loop if the process exits while not being closed (its
        requests have ended with an error by then)."""
        config = load_config(config_path)
        requests, requests_child = socket.socketpair()
        control, control_child = socket.socketpair()
        process = subprocess.Popen(
            [sys.executable, "-m", "tokenrouter.fleet.pair_host", str(config_path), str(requests_child.fileno()),
             str(control_child.fileno())], pass_fds=(requests_child.fileno(), control_child.fileno()))
        requests_child.close()
        control_child.close()
        reader, writer = await asyncio.open_unix_connection(sock=requests)
        try:
            first: Ready | Failed = expect(await _read(reader), Ready | Failed, "the Dynamo worker starting its pair")
        except (asyncio.IncompleteReadError, ConnectionError):
            code = await asyncio.to_thread(process.wait)
            raise PairProcessError(f"the pair's process exited while starting (code {code})") from None
        except UnknownMessage as exc:
            process.kill()
            await asyncio.to_thread(process.wait)
            raise PairProcessError(str(exc)) from None
        match first:
            case Failed(reason):
                await asyncio.to_thread(process.wait)
                raise PairProcessError(f"the pair failed to start: {reason}")
            case Ready():
                return cls(config, process, reader, writer, BlockingChannel(control), first, on_lost)

    @property
    def pid(self) -> int:
        return self._process.pid

    # --- requests ----------------------------------------------------------------------------------
    def submit(self, prompt: list[int], keywords: dict[str, Any]) -> PairStream:
        """Start a request (``TokenRouter.submit``'s keywords); a refusal arrives on the stream."""
        stream = PairStream(next(self._keys))
        if self._reading.done():
            stream.refuse("error", "the pair's process has exited")
            return stream
        self._streams[stream.key] = stream
        self._writer.write(encode(Submit(stream.key, prompt, keywords)))
        return stream

    def cancel(self, stream: PairStream) -> None:
        """End the request on every model (its KV is freed); nothing more arrives on ``stream``."""
        if self._streams.pop(stream.key, None) is not None and not self._writer.is_closing():
            self._writer.write(encode(Cancel(stream.key)))

    async def _read_outputs(self) -> None:
        try:
            while True:
                out: Out = expect(await _read(self._reader), Out, "the Dynamo worker")
                for key, tokens, origins, logprobs, finish_reason, error in out.outputs:
                    if (stream := self._streams.get(key)) is not None:
                        stream.add(tokens, origins, logprobs, finish_reason, error)
                        if finish_reason is not None:
                            del self._streams[key]
                for key, kind, message in out.refused:
                    if (stream := self._streams.pop(key, None)) is not None:
                        stream.refuse(kind, message)
        except (asyncio.IncompleteReadError, ConnectionError, UnknownMessage) as exc:
            why = f"the pair's process exited (code {self._process.poll()})"
            if isinstance(exc, UnknownMessage):  # out of step with this worker: lost all the same
                self._process.kill()
                why = f"the pair's process was stopped: {exc}"
            for stream in self._streams.values():
                stream.refuse("error", why)
            self._streams.clear()
            if not self._closing:
                self._on_lost(why)

    # --- introspection (blocking: one round trip to the pair's control thread) ------------------------
    def kv_blocks_used(self) -> dict[str, int]:
        return self._stats().kv_blocks_used

    def held_requests(self) -> dict[str, int]:
        return self._stats().held_requests

    @property
    def alive(self) -> bool:
        return self._process.poll() is None and self._stats().alive

    def _stats(self) -> Stats:
        with self._control_lock:
            try:
                self._control.send(AskStats())
                answer: ControlAnswer = expect(self._control.receive(), ControlAnswer, "the Dynamo worker")
            except (EOFError, OSError):
                raise PairProcessError(f"the pair's process exited (code {self._process.poll()})") from None
            except UnknownMessage as exc:
                raise PairProcessError(str(exc)) from None
        match answer:
            case Stats():
                return answer
            case ControlError(reason):
                raise PairProcessError(f"the pair's process could not answer: {reason}")

    # --- lifecycle ---------------------------------------------------------------------------------------
    async def close(self) -> None:
        """Stop the pair (its loops end their requests) and wait for the process."""
        if self._closing:
            return
        self._closing = True
        if not self._writer.is_closing():
            self._writer.write(encode(Close()))
        try:
            await asyncio.to_thread(self._process.wait, STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            await asyncio.to_thread(self._process.wait)
        await self._reading
        self._writer.close()
        self._control.close()


async def _read(reader: asyncio.StreamReader) -> Any:
    (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    return decode(await reader.readexactly(size))
