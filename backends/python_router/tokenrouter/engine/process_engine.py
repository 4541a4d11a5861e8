"""An engine in a child process of its own, behind the same step contract.

vLLM keeps a process-global forward context and binds its threads process-wide, so two vLLM
engines in one process corrupt or slow each other. The embedded API (two subservers, one process)
therefore runs each such engine here: a child started with ``python -m`` (no re-import of the
caller's main module, so scripts need no ``__main__`` guard), pinned to the spec's ``cpus``,
talking over a socket pair (its messages: process_messages.py). Calls are synchronous; the parent
mirrors sequence lengths and the free-block count so that admission queries cost no round trip.
A step's full-vocabulary logits (about 5 MB at batch 8 on a 152k vocabulary) cross through a
shared-memory buffer instead of the socket, which would cost more than a millisecond per megabyte.
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from multiprocessing import resource_tracker, shared_memory
from multiprocessing.connection import Connection
from typing import Any, Mapping, Sequence

import torch

from ..config import ModelSpec
from ..pipe_messages import UnknownMessage, expect
from .base import Engine, LengthTable, SeqId, StepResult, StepRow
from .process_messages import Call, Close, FromEngine, Raised, Returned, Start, ToEngine


PARENT_POLL_S = 0.5  # how often a child looks whether its parent is still there


class EngineProcessError(RuntimeError):
    """The engine process failed to start or died."""


class EngineProcess(LengthTable, Engine):
    def __init__(self, name: str, spec: ModelSpec, env: Mapping[str, str] | None = None) -> None:
        """``env``: the child's environment (default: this process's)."""
        self.name = name
        parent, child = socket.socketpair()
        env = dict(os.environ if env is None else env)
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tokenrouter.engine.process_engine", str(child.fileno())],
            pass_fds=(child.fileno(),), env=env,
        )
        child.close()
        self._conn = Connection(parent.detach())
        self._lock = threading.Lock()
        self._lengths: dict[SeqId, int] = {}
        self._closed = False
        self._send(Start(name, spec.model_dump()))
        facts = self._receive()
        self._facts: dict[str, Any] = facts
        self._free_blocks: int = facts["num_free_blocks"]
        self._logits = LogitsBuffer.attach(facts["logits_buffer"], facts["vocab_size"])

    # --- shape facts, fixed at start --------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._facts["vocab_size"]

    @property
    def hidden_size(self) -> int:
        return self._facts["hidden_size"]

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._facts["eos_token_ids"]

    @property
    def max_model_len(self) -> int:
        return self._facts["max_model_len"]

    @property
    def block_size(self) -> int:
        return self._facts["block_size"]

    @property
    def num_total_blocks(self) -> int:
        return self._facts["num_total_blocks"]

    @property
    def num_free_blocks(self) -> int:
        return self._free_blocks  # changes only through our own step and release calls

    @property
    def pid(self) -> int:
        return self._process.pid

    # --- sequences ----------------------------------------------------------------------------
    def add_sequence(self, seq_id: SeqId) -> None:
        self._call("add_sequence", seq_id)
        self._lengths[seq_id] = 0

    def release(self, seq_id: SeqId) -> bool:
        if seq_id not in self._lengths:
            return False
        del self._lengths[seq_id]
        return self._call("release", seq_id)

    def step(self, rows: Sequence[StepRow], *, return_hidden: bool = False, top_logits: int = 0,
             return_logits: bool = True) -> StepResult:
        try:
            result, in_buffer = self._call("step", list(rows), return_hidden=return_hidden, top_logits=top_logits,
                                           return_logits=return_logits)
        except EngineProcessError:
            raise
        except BaseException:
            # The child releases the rows of a failed forward; mirror what it holds now.
            held = set(self._call("sequence_ids"))  # one round trip, not one per sequence
            self._lengths = {seq: n for seq, n in self._lengths.items() if seq in held}
            raise
        if in_buffer:  # the child put the logits in the shared buffer
            result.logits = self._logits.read(len(result.seq_ids))
        for seq_id, position in zip(result.seq_ids, result.positions.tolist()):
            self._lengths[seq_id] = position
        return result

    def call(self, method: str, *args: Any) -> Any:
        """Any other engine method (or attribute) by name, in the child (tests read vLLM's counters)."""
        return self._call(method, *args)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            with self._lock:
                self._send(Close())
            self._process.wait(timeout=30)
        except (OSError, EOFError, subprocess.TimeoutExpired):
            self._process.kill()
            self._process.wait()
        finally:
            self._conn.close()
            self._logits.close()

    # --- transport ------------------------------------------------------------------------------
    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self._send(Call(method, args, kwargs))
            return self._receive()

    def _send(self, message: ToEngine) -> None:
        if self._closed and not isinstance(message, Close):
            raise EngineProcessError(f"engine '{self.name}' is closed")
        try:
            self._conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        except OSError as err:
            raise EngineProcessError(f"engine '{self.name}': its process is gone ({err})") from None

    def _receive(self) -> Any:
        try:
            answer: FromEngine = expect(_receive(self._conn), FromEngine, f"the parent of engine '{self.name}'")
        except (EOFError, OSError):
            code = self._process.poll()
            raise EngineProcessError(f"engine '{self.name}': its process exited (code {code})") from None
        except UnknownMessage as err:  # the pipe is out of step: as fatal as a dead process
            raise EngineProcessError(str(err)) from None
        if answer.free_blocks is not None:
            self._free_blocks = answer.free_blocks
        match answer:
            case Returned(value):
                return value
            case Raised(error):
                raise error


def _receive(conn: Connection) -> object:
    return pickle.loads(conn.recv_bytes())


def serve_engine(conn: Connection) -> None:
    """The child's work: build the engine, then answer calls until told to close (or the parent is gone)."""
    from .factory import create_engine

    try:
        start: Start = expect(_receive(conn), Start, "an engine process not started yet")
    except UnknownMessage as err:
        _reply(conn, Raised(err, None))
        return
    try:
        engine = create_engine(start.name, ModelSpec(**start.spec), owns_process=True)
        facts = {key: getattr(engine, key) for key in (
            "vocab_size", "hidden_size", "eos_token_ids", "max_model_len", "block_size", "num_total_blocks",
            "num_free_blocks")}
        logits = LogitsBuffer.create(start.spec["max_batch_size"], engine.vocab_size)
        facts["logits_buffer"] = logits.name
        _reply(conn, Returned(facts, None))
    except BaseException as err:  # noqa: BLE001 - the parent must learn why the start failed
        _reply(conn, Raised(EngineProcessError(f"engine '{start.name}' failed to start: {err!r}"), None))
        return
    while True:
        try:
            message: Call | Close = expect(_receive(conn), Call | Close, f"engine '{start.name}'")
        except (EOFError, OSError):
            break  # the parent is gone
        except UnknownMessage as err:  # answered like a call that raised
            _reply(conn, Raised(err, engine.num_free_blocks))
            continue
        match message:
            case Close():
                break
            case Call(method, args, kwargs):
                _reply(conn, _answer(engine, logits, method, args, kwargs))
    engine.close()
    logits.close()
    logits.unlink()


def _answer(engine: Engine, logits: "LogitsBuffer", method: str, args: tuple[Any, ...],
            kwargs: dict[str, Any]) -> FromEngine:
    try:
        value = getattr(engine, method)
        if callable(value):
            value = value(*args, **kwargs)
        if method == "step":  # (result, whether its logits went through the shared buffer)
            in_buffer = value.logits is not None and logits.write(value.logits)
            value = (replace(value, logits=None) if in_buffer else value), in_buffer
        return Returned(value, engine.num_free_blocks)
    except Exception as err:  # noqa: BLE001 - per-call errors go back to the caller
        return Raised(err, engine.num_free_blocks)


class LogitsBuffer:
    """Shared memory for one step's float32 logits [rows, vocab], written by the child and copied
    out by the parent before the next call. A step with more rows than it holds pickles them."""

    def __init__(self, memory: shared_memory.SharedMemory, vocab_size: int) -> None:
        self._memory = memory
        self._vocab = vocab_size
        self._rows = memory.size // (4 * vocab_size)

    @classmethod
    def create(cls, rows: int, vocab_size: int) -> "LogitsBuffer":
        return cls(shared_memory.SharedMemory(create=True, size=4 * rows * vocab_size), vocab_size)

    @classmethod
    def attach(cls, name: str, vocab_size: int) -> "LogitsBuffer":
        memory = shared_memory.SharedMemory(name=name)
        # Python < 3.13 registers an attached segment with this process's resource tracker too,
        # which would unlink it (and warn) at our exit: the creating child owns it. It registers the
        # private _name (with POSIX's leading slash), which the typeshed stubs leave out.
        resource_tracker.unregister(getattr(memory, "_name"), "shared_memory")
        return cls(memory, vocab_size)

    @property
    def name(self) -> str:
        return self._memory.name

    def _view(self, rows: int) -> torch.Tensor:
        return torch.frombuffer(self._memory.buf, dtype=torch.float32, count=rows * self._vocab).view(rows, self._vocab)

    def write(self, logits: torch.Tensor) -> bool:
        if logits.shape[0] > self._rows or logits.dtype != torch.float32:
            return False
        self._view(logits.shape[0]).copy_(logits)
        return True

    def read(self, rows: int) -> torch.Tensor:
        return self._view(rows).clone()

    def close(self) -> None:
        self._memory.close()

    def unlink(self) -> None:
        self._memory.unlink()


def die_with_parent() -> None:
    """End this process soon after its parent dies. Without it a child busy loading a model or running
    a long call (several GB of memory) outlived a killed parent until that call ended. Linux's
    PR_SET_PDEATHSIG would fire when the parent *thread* that started us exits (engines are started
    from thread pools), so a daemon thread watches for being re-parented instead."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _reply(conn: Connection, answer: FromEngine) -> None:
    try:
        payload = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as err:  # noqa: BLE001 - a value or an exception type that does not pickle
        said = repr(answer.error) if isinstance(answer, Raised) else repr(err)
        payload = pickle.dumps(Raised(RuntimeError(said), answer.free_blocks), protocol=pickle.HIGHEST_PROTOCOL)
    conn.send_bytes(payload)


if __name__ == "__main__":
    # Run the imported module's serve_engine, not this __main__ copy's: exceptions sent back must
    # pickle as tokenrouter.engine.process_engine classes.
    from tokenrouter.engine import process_engine

    die_with_parent()
    process_engine.serve_engine(Connection(int(sys.argv[1])))
