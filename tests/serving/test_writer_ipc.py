"""What the entry's response writer spends on Triton's IPC: only the outputs a caller asked for,
and cancellation polls only of senders that Triton can mark cancelled, fewer per sender when many
are live. (A fake pb_utils: the property is our bookkeeping; the e2e and reliability suites run
the same writer on a real server.)"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from tokenrouter.serving.cancel_polling import CANCEL_POLL_S, MAX_CANCEL_POLLS_PER_S, cancel_poll_interval
from tokenrouter.serving.subserver.output_chunk import OutputChunk
from tokenrouter.serving.subserver.subserver_writer import SubserverWriter


class CountingSender:
    def __init__(self) -> None:
        self.polls, self.sent, self.lock = 0, [], threading.Lock()

    def is_cancelled(self) -> bool:
        with self.lock:
            self.polls += 1
        return False

    def send(self, response=None, flags: int = 0) -> None:
        with self.lock:
            self.sent.append(response)


PB = SimpleNamespace(TRITONSERVER_RESPONSE_COMPLETE_FINAL=1, Tensor=lambda name, array: (name, array),
                     InferenceResponse=lambda output_tensors=None, error=None: dict(output_tensors or []))


def test_the_entry_polls_a_client_s_sender_but_never_a_front_s() -> None:
    """A front's request (keyed) is cancelled by its front's control call; Triton never marks a BLS
    request cancelled, so polling it is an IPC round trip for nothing. Catches keyed senders polled."""
    writer = SubserverWriter(PB, SimpleNamespace(cancel=lambda rid: None), cancel_poll_s=0.01)
    client, front = CountingSender(), CountingSender()
    try:
        writer.track("slm-0", client)
        writer.track("slm-1", front, key="front-key")
        time.sleep(0.2)
    finally:
        writer.close()
    assert client.polls >= 5 and front.polls == 0


def test_many_live_senders_share_the_poll_budget() -> None:
    assert cancel_poll_interval(1) == cancel_poll_interval(10) == CANCEL_POLL_S
    assert cancel_poll_interval(64) == 64 / MAX_CANCEL_POLLS_PER_S > CANCEL_POLL_S
    assert cancel_poll_interval(1000) * MAX_CANCEL_POLLS_PER_S == 1000  # each polled, the total bounded


def test_a_response_carries_only_the_outputs_asked_for() -> None:
    """Catches the writer building every output whatever the caller requested."""
    writer = SubserverWriter(PB, SimpleNamespace(cancel=lambda rid: None))
    picky, everything = CountingSender(), CountingSender()
    try:
        for rid, sender, wanted in (("a", picky, frozenset({"output_ids", "is_final"})), ("b", everything, None)):
            writer.track(rid, sender)
            writer.respond(rid, sender, OutputChunk([5, 6], [b"slm", b"llm"], [4], "length", 0.5, []), wanted)
        deadline = time.monotonic() + 5
        while not (picky.sent and everything.sent) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        writer.close()
    assert set(picky.sent[0]) == {"output_ids", "is_final"}
    assert picky.sent[0]["output_ids"].tolist() == [[5, 6]]
    assert set(everything.sent[0]) == {"output_ids", "prefix_ids", "output_models", "output_log_probs",
                                       "finish_reason", "large_model_share", "is_final"}
