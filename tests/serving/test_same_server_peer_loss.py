"""A same-server peer lost, end to end over the real pieces but Triton: the entry's messages to the
large model go through its peer link (PeerLink's session over BlsChannel, BLS through a fake
pb_utils) into the large model's receiving end (PeerSessions) and its runtime subserver, as the
peer model's intake applies them; both models are the embedded runtime's, on simulated engines.

The large model's stub goes away (its steps wait, and a BLS call into it raises, as Triton's does
for a model it cannot reach). The property: the one
consequence of a lost peer, ``Subserver.peer_lost``, ends every request that needed it with an error
naming the peer, in bounded time, and the entry's KV balances to zero; when the stub comes back, the
link's new session makes it give up the old session's requests, so its KV balances to zero too, and
the pair serves again. A lost peer that ended nothing would time out here; one whose requests the
large model kept would leave its KV used."""

from __future__ import annotations

import threading
import time
from typing import Iterator

from helpers.waiting import wait_for
from fake_pb_utils import BlsCall, EntryResponse, fake_pb

from tokenrouter.protocol import decode_batch
from tokenrouter.runtime.api import TokenRouter
from tokenrouter.serving.schema import PEER_INPUT
from tokenrouter.serving.subserver.bls_channel import SAME_SERVER, BlsChannel
from tokenrouter.serving.subserver.peer_link import PeerLink
from tokenrouter.serving.subserver.peer_sessions import LinkRefused, PeerSessions
from tokenrouter.serving.subserver.placed_transport import PlacedTransport

SECRET = "server-start-secret"
VIEW = {"models": ["slm", "llm"]}
DOWN_AFTER_S = 0.5
LLM = 1  # the large model's index in a request's origins
CONFIG = {
    # eos_rate 0: every request runs to max_tokens unless something ends it
    "models": {"slm": {"engine": "simulated", "profile": {"base": "tiny-cpu-small", "base_ms": 0.5, "eos_rate": 0.0}},
               "llm": {"engine": "simulated", "profile": {"base": "tiny-cpu-large", "base_ms": 2.0, "eos_rate": 0.0}}},
    "policy": {"name": "random", "params": {"rate": 0.3, "seed": 5, "run_length": 4}},
    "scheduling": {"strategy": "tokenrouter", "max_active": 8, "max_wait_ms": 5.0},
}


class LargeModelStub:
    """The large model's side of BLS: its intake's receiving end feeding its subserver. ``hang()``
    stops its steps and fails the calls into it (a stub gone); ``resume()`` brings it back."""

    def __init__(self, router: TokenRouter) -> None:
        self.subserver = router.subservers["llm"]
        self.sessions = PeerSessions(VIEW, {"slm": SECRET}, here="'llm'", on_session_lost=self.subserver.peer_lost)
        self._running = threading.Event()
        self._running.set()
        engine = self.subserver.engine
        step = engine.step

        def gated_step(*args, **kwargs):
            self._running.wait(30)
            return step(*args, **kwargs)

        engine.step = gated_step  # type: ignore[method-assign]  # the stub stops stepping on hang()

    def hang(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def answer(self, call: BlsCall) -> Iterator[EntryResponse]:
        if not self._running.is_set():
            raise RuntimeError("Failed to execute the inference request: model 'llm' is not available")
        payload = call.inputs[PEER_INPUT].reshape(-1)[0]
        try:
            ready = self.sessions.take(call.parameters, lambda: decode_batch(payload))
        except LinkRefused as refused:
            return iter([EntryResponse(error=str(refused))])
        for message in ready:
            self.subserver.deliver(message)
        return iter([EntryResponse()])


def test_a_lost_same_server_peer_ends_its_requests_clearly_and_both_pools_balance() -> None:
    with TokenRouter.from_config(CONFIG) as router:
        entry, stub = router.entry, LargeModelStub(router)
        pb = fake_pb(answer=stub.answer)
        transport = PlacedTransport()
        transport.add_link(PeerLink("slm", "llm", "this server", lambda on_answer, on_broken: BlsChannel(
            pb, "llm", on_answer, on_broken, server_serving=lambda: True), secret=SECRET, view=VIEW,
            down_after_s=DOWN_AFTER_S, pacing=SAME_SERVER,
            on_up=lambda peer: None, on_down=entry.peer_lost), remote=False)
        entry.transport = transport  # the entry's messages to the large model go by the link from now on
        try:
            warm = router.generate([[3, 5, 7]] * 4, max_tokens=40, seed=[1, 2, 3, 4], timeout=30)
            assert all(r.finish_reason == "length" for r in warm)
            assert any("llm" in r.models for r in warm)  # the link carried handoffs to the large model

            handles = [router.submit([3 + i, 9, 11], max_tokens=400, seed=10 + i) for i in range(8)]
            wait_for(lambda: sum(LLM in h.origins for h in handles) >= 2)  # some are routed, some away now
            stub.hang()
            hung = time.monotonic()
            results = [h.wait(10) for h in handles]
            errors = [r.error or "" for r in results if r.finish_reason == "error"]
            assert errors and all(r.finish_reason in ("error", "length") for r in results)
            assert all("model 'llm' at this server is unreachable" in e for e in errors), errors
            assert time.monotonic() - hung < 10 * DOWN_AFTER_S
            wait_for(lambda: router.kv_blocks_used()["slm"] == 0 and router.held_requests()["slm"] == 0)
            assert entry.active == 0

            time.sleep(2 * DOWN_AFTER_S)  # the entry's releases, held for a session, go with the peer too
            stub.resume()  # a new session: the large model gives up what the lost one carried
            wait_for(lambda: router.kv_blocks_used()["llm"] == 0 and router.held_requests()["llm"] == 0)
            again = router.generate([[3, 5, 7]] * 4, max_tokens=40, seed=[1, 2, 3, 4], timeout=30)
            assert [r.token_ids for r in again] == [r.token_ids for r in warm]
            assert router.kv_blocks_used() == {"slm": 0, "llm": 0}
        finally:
            stub.resume()
            transport.close()
