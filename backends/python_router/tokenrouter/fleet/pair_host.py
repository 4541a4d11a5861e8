"""The pair's process: one replica's embedded runtime, driven by its Dynamo worker (``pair_process``).

Started as ``python -m tokenrouter.fleet.pair_host CONFIG REQUESTS_FD CONTROL_FD``. The worker's
process keeps Dynamo's bridge and event loop; this one keeps every model's subserver loops, so the
two do not share one interpreter lock (the way Triton gives each model its own stub process).

On the requests socket the worker sends ``Submit`` / ``Cancel`` / ``Close`` (pair_messages.py); this
process answers with ``Ready`` (or ``Failed``) once, then ``Out`` messages: every request's output since
the last message and the submits refused, one message for whatever the loops committed meanwhile (a
step's tokens for the whole batch travel together). The control socket answers ``AskStats`` (KV blocks
and held requests per model) on a thread of its own, so a metrics scrape never waits behind tokens.
"""

from __future__ import annotations

import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass

from ..engine.process_engine import die_with_parent
from ..pipe_messages import UnknownMessage, expect
from ..request_builder import RequestError
from ..runtime.admission import ServerBusy
from ..runtime.api import RequestHandle, TokenRouter
from .frames import BlockingChannel
from .pair_messages import AskStats, Cancel, Close, ControlAnswer, ControlError, Failed, Out, Output, Ready, Refusal, \
    Stats, Submit, ToPair

COALESCE_S = 0.002  # far below a step and below the pacing of responses, far above the GIL hand-offs it saves


@dataclass
class _Followed:
    handle: RequestHandle
    sent: int = 0  # output tokens already sent to the worker


class Outbox:
    """Sends requests' new output to the worker from a thread of its own: the loops only mark a
    request as changed (no pickling or socket write on a subserver's loop)."""

    def __init__(self, channel: BlockingChannel) -> None:
        self._channel = channel
        self._changed = threading.Condition()
        self._followed: dict[int, _Followed] = {}
        self._dirty: dict[int, None] = {}  # keys with new output, in the order they changed
        self._refused: list[Refusal] = []
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="pair-outbox", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def follow(self, key: int, handle: RequestHandle) -> None:
        with self._changed:
            self._followed[key] = _Followed(handle)
        handle.add_listener(lambda: self._mark(key))
        self._mark(key)  # output may have come before the listener

    def handle(self, key: int) -> RequestHandle | None:
        with self._changed:
            followed = self._followed.get(key)
        return None if followed is None else followed.handle

    def refuse(self, key: int, kind: str, message: str) -> None:
        with self._changed:
            self._refused.append((key, kind, message))
            self._changed.notify()

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify()
        self._thread.join(timeout=5)

    def _mark(self, key: int) -> None:
        with self._changed:
            self._dirty[key] = None
            self._changed.notify()

    def _run(self) -> None:
        while True:
            with self._changed:
                while not (self._dirty or self._refused or self._stopped):
                    self._changed.wait()
                if self._stopped:
                    return
            # The rest of the step's rows join this message: one wake-up and one write per step, not per row.
            time.sleep(COALESCE_S)
            with self._changed:
                dirty, self._dirty = list(self._dirty), {}
                refused, self._refused = self._refused, []
                followed = [(key, self._followed.get(key)) for key in dirty]
            outputs: list[Output] = []
            for key, entry in followed:
                if entry is None:
                    continue
                tokens, origins, logprobs, finish_reason, error = entry.handle.since(entry.sent)
                if not tokens and finish_reason is None:
                    continue
                entry.sent += len(tokens)
                outputs.append((key, tokens, origins, logprobs, finish_reason, error))
                if finish_reason is not None:
                    with self._changed:
                        self._followed.pop(key, None)
            try:
                self._channel.send(Out(outputs, refused))
            except OSError:
                return  # the worker is gone; the main thread sees it too and ends


def serve(config: str, requests: BlockingChannel, control: BlockingChannel) -> None:
    try:
        router = TokenRouter.from_config(config)
    except BaseException as exc:  # noqa: BLE001 - the worker must learn why the start failed
        requests.send(Failed(f"{type(exc).__name__}: {exc}"))
        return
    entry = router.engines[router.config.entry]
    requests.send(Ready(router.max_model_len, entry.block_size, entry.num_total_blocks))
    outbox = Outbox(requests)
    outbox.start()
    threading.Thread(target=answer_control, args=(router, control), name="pair-control", daemon=True).start()
    try:
        take_requests(router, requests, outbox)
    finally:
        router.shutdown()
        outbox.stop()


def take_requests(router: TokenRouter, requests: BlockingChannel, outbox: Outbox) -> None:
    """The worker's submits and cancels, until it closes the pair or is gone. A message of another kind
    (the worker runs other code) raises UnknownMessage: the process ends, saying so."""
    while True:
        try:
            message: ToPair = expect(requests.receive(), ToPair, "the pair's process")
        except (EOFError, OSError):
            return  # the worker is gone
        match message:
            case Submit(key, prompt, keywords):
                try:
                    outbox.follow(key, router.submit(prompt, **keywords))
                except RequestError as exc:
                    outbox.refuse(key, "invalid", str(exc))
                except ServerBusy as exc:
                    outbox.refuse(key, "busy", str(exc))
                except Exception as exc:  # noqa: BLE001 - that request's error, not this process's
                    outbox.refuse(key, "error", f"{type(exc).__name__}: {exc}")
            case Cancel(key):
                if (handle := outbox.handle(key)) is not None:
                    router.cancel(handle)
            case Close():
                return


def answer_control(router: TokenRouter, control: BlockingChannel) -> None:
    """Answers the worker's questions until it is gone."""
    while True:
        try:
            question = control.receive()
        except (EOFError, OSError):
            return
        answer: ControlAnswer
        try:
            expect(question, AskStats, "the pair's control thread")
            answer = Stats(router.kv_blocks_used(), router.held_requests(), router.alive)
        except UnknownMessage as exc:  # answered, so that the worker is told and never waits
            answer = ControlError(str(exc))
        control.send(answer)


def main(argv: list[str]) -> None:
    config, requests_fd, control_fd = argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker decides when this process ends (it drains first)
    die_with_parent()
    serve(config, BlockingChannel(socket.socket(fileno=int(requests_fd))),
          BlockingChannel(socket.socket(fileno=int(control_fd))))


if __name__ == "__main__":
    # The imported module's main, not this __main__ copy's (one set of classes for what is pickled).
    from tokenrouter.fleet import pair_host

    pair_host.main(sys.argv[1:])
