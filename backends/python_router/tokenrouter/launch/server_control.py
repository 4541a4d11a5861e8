"""The launcher's calls to the models of a running tritonserver: the drain (fronts refuse new requests,
those in flight finish), the ending of every request in flight, and the authenticated control call
both are made of (serving/control.py, signed as in serving/peer_auth.py), with the entry subserver's
held requests read from its metrics."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from tokenrouter.serving.control import ControlCall
from tokenrouter.serving.peer_auth import peer_parameters
from tokenrouter.serving.schema import CONTROL_INPUT

# The entry subserver's gauges of the requests it holds, and how long they must read 0 for a drain
# to be over (the metrics refresh every 0.5 s)
HELD_GAUGES = ("tokenrouter_active_requests", "tokenrouter_queue_depth")
IDLE_S = 1.0
CALL_TIMEOUT_S = 5.0  # one control call or metrics read; one that takes longer says nothing
DRAIN_POLL_S = 0.2


@dataclass
class ServerControl:
    """Control calls to one server start's models, authenticated with that start's ``secret``."""

    grpc_url: str  # host:port
    metrics_url: str  # host:port
    secret: str = ""

    def drain(self, fronts: list[str], timeout_s: float, entry: str | None = None,
              reason: str = "the server is shutting down; try again") -> bool:
        """Refuse new requests at the ``fronts`` and wait up to ``timeout_s`` for those in flight.

        Triton's own SIGTERM drain does not hold for requests that make new internal requests (a
        front's call to the entry subserver, each handoff is a BLS call): those are refused as soon
        as the server stops. Unloading the fronts does not hold either: Triton 2.51 keeps a model
        for every client gRPC stream whose first request went to it, until the client closes the
        stream (stream_infer_handler.cc), so such an unload never finishes. So each front is told
        to drain (an authenticated control call): it refuses new requests with ``reason`` and
        answers whether any is still in flight. Done when every front answered none and the
        ``entry`` subserver (which clients may call directly) held no request on two reads of its
        metrics IDLE_S apart. A call that fails or stalls says nothing: the drain goes on until its
        deadline, never ends early. Returns True when all drained in time."""
        deadline = time.monotonic() + timeout_s
        idle_since = None
        while True:
            fronts_idle = all([self.call(front, "drain", reason) for front in fronts])  # each one is told
            if fronts_idle and (entry is None or self.requests_held(entry) == 0):
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since >= IDLE_S or entry is None:
                    return True
            else:
                idle_since = None
            if time.monotonic() >= deadline:
                return False
            time.sleep(DRAIN_POLL_S)

    def requests_held(self, subserver: str) -> float | None:
        """Requests that ``subserver`` holds, active or waiting for admission, from its metrics
        (refreshed twice a second); None when they cannot be read."""
        try:
            with urllib.request.urlopen(f"http://{self.metrics_url}/metrics",
                                        timeout=CALL_TIMEOUT_S) as reply:
                page = reply.read().decode()
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return None
        wanted = {f'{family}{{model="{subserver}"}}' for family in HELD_GAUGES}
        values = [float(line.rsplit(" ", 1)[1]) for line in page.splitlines() if line.split(" ", 1)[0] in wanted]
        return sum(values) if len(values) == len(wanted) else None

    def end_in_flight(self, model: str, reason: str) -> bool:
        """Tell ``model`` (a front, the core model or the entry subserver) to end every request in flight
        with an error saying ``reason``. Returns whether it was taken."""
        return self.call(model, "shutdown", reason)

    def call(self, model: str, command: str, reason: str) -> bool:
        """An authenticated control call (serving/control.py) to ``model``, a front or the entry subserver,
        on the ``control`` input they all declare. Whether it answered without an error within CALL_TIMEOUT_S."""
        import queue

        import tritonclient.grpc as grpcclient

        payload = grpcclient.InferInput(CONTROL_INPUT, [1, 1], "BYTES")
        payload.set_data_from_numpy(ControlCall(command, reason).row())
        answers: queue.Queue = queue.Queue()
        client = None
        try:
            client = grpcclient.InferenceServerClient(self.grpc_url)
            client.start_stream(callback=lambda result, error: answers.put(error))
            client.async_stream_infer(model, [payload], enable_empty_final_response=True,
                                      parameters=peer_parameters(self.secret))
            return answers.get(timeout=CALL_TIMEOUT_S) is None
        except Exception:  # noqa: BLE001 - the server may be gone or stalled; the caller goes on
            return False
        finally:
            if client is not None:  # cancelled, not closed: a stalled server would hold a close forever
                client.stop_stream(cancel_requests=True)
                client.close()
