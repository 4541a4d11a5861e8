"""Which channel should carry peer messages between two Triton servers? Both candidates measured.

    python -m tokenrouter_tools.bench.peer_channel [--batches 2000] [--rate 250] [--sizes 1 16]

(a) ``triton``: Triton's own ModelStreamInfer (tritonclient's gRPC stream) into a Python model that
    does what a subserver's intake does with a peer message (decode the JSON batch, answer FINAL);
(b) ``grpcio``: a dedicated grpcio bidirectional stream (raw bytes, no codegen) to a server process
    that decodes the same batch and answers a one-byte ack.

For each: the round trip of one batch at a time (median, p90), and, with batches sent at a step-like
rate without waiting (pipelined), the CPU seconds per batch of the sending process and of the
receiving processes (tritonserver and its stub, or the grpcio server). docs/runtime.md has the
numbers and the choice.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any, Callable, Iterable

from tokenrouter.procfs import group_cpu_s
from tokenrouter.protocol import PeerMessage, decode_batch, encode_batch
from tokenrouter.serving.repository import model_config, write_model
from tokenrouter.serving.schema import PEER_INPUT, SUBSERVER_INPUTS


SINK = "peer_sink"
METHOD = "/tokenrouter.PeerLink/Messages"
SINK_MODEL = '''
import triton_python_backend_utils as pb_utils
from tokenrouter.protocol import decode_batch


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            payload = pb_utils.get_input_tensor_by_name(request, "peer_message").as_numpy().reshape(-1)[0]
            decode_batch(payload)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''


def sample_batch(size: int) -> bytes:
    """``size`` handoffs as a step sends them: a suffix of a few tokens, the policy's state."""
    return encode_batch([PeerMessage(kind="handoff", rid=f"slm-{i}", sender="slm", anchor=200 + i,
                                     tokens=[17, 4242, 99, 1000, 5], origins=[0, 0, 0, 0, 0], state={"seed": i})
                         for i in range(size)])


class TritonChannel:
    """tritonclient's stream: one async_stream_infer per batch, acks in the callback."""

    def __init__(self, url: str) -> None:
        import tritonclient.grpc as grpcclient

        self._grpc = grpcclient
        self._acks: queue.Queue = queue.Queue()
        self.client = grpcclient.InferenceServerClient(url)
        self.client.start_stream(callback=lambda result, error: self._acks.put(error))

    def send(self, payload: bytes) -> None:
        tensor = self._grpc.InferInput(PEER_INPUT, [1, 1], "BYTES")
        tensor.set_data_from_numpy(SUBSERVER_INPUTS[PEER_INPUT].row(payload))
        self.client.async_stream_infer(SINK, [tensor], parameters={"tokenrouter_pair_secret": "x" * 43},
                                       enable_empty_final_response=True)

    def ack(self) -> None:
        error = self._acks.get(timeout=10)
        if error is not None:
            raise RuntimeError(error)

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


class GrpcioChannel:
    """A raw-bytes bidirectional grpcio stream (generic method, identity serializers)."""

    def __init__(self, url: str) -> None:
        import grpc

        self._outbox: queue.Queue = queue.Queue()
        self._channel = grpc.insecure_channel(url)
        call = self._channel.stream_stream(METHOD)(iter(self._outbox.get, None),
                                                  metadata=(("tokenrouter-pair-secret", "x" * 43),))
        self._acks: queue.Queue = queue.Queue()
        threading.Thread(target=self._count_acks, args=(call,), daemon=True).start()

    def _count_acks(self, call: Iterable[bytes]) -> None:
        for _ in call:
            self._acks.put(None)

    def send(self, payload: bytes) -> None:
        self._outbox.put(payload)

    def ack(self) -> None:
        self._acks.get(timeout=10)

    def close(self) -> None:
        self._outbox.put(None)
        self._channel.close()


def serve_grpcio(port: int) -> None:
    """The receiving side of (b), in its own process: decode each batch, ack it."""
    import grpc

    def messages(requests, context):
        for payload in requests:
            decode_batch(payload)
            yield b"\x01"

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    handler = grpc.method_handlers_generic_handler("tokenrouter.PeerLink", {
        "Messages": grpc.stream_stream_rpc_method_handler(messages)})
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()


def measure(channel, receiver_cpu: Callable[[], float], size: int, batches: int, rate: float) -> dict:
    payload = sample_batch(size)
    for _ in range(50):  # warm up
        channel.send(payload)
        channel.ack()
    trips = []
    for _ in range(min(batches, 500)):
        start = time.perf_counter()
        channel.send(payload)
        channel.ack()
        trips.append(time.perf_counter() - start)
    cpu_send, cpu_receive = time.process_time(), receiver_cpu()
    acked = threading.Thread(target=lambda: [channel.ack() for _ in range(batches)])
    acked.start()
    start = time.perf_counter()
    for i in range(batches):  # paced like a decoding loop's steps, never waiting for acks
        time.sleep(max(0.0, start + i / rate - time.perf_counter()))
        channel.send(payload)
    acked.join()
    sender, receiver = time.process_time() - cpu_send, receiver_cpu() - cpu_receive
    trips.sort()
    return {"messages_per_batch": size, "bytes": len(payload), "rtt_median_ms": 1e3 * statistics.median(trips),
            "rtt_p90_ms": 1e3 * trips[int(0.9 * len(trips))], "send_cpu_ms_per_batch": 1e3 * sender / batches,
            "receive_cpu_ms_per_batch": 1e3 * receiver / batches,
            "cpu_us_per_message": 1e6 * (sender + receiver) / (batches * size)}


def run_triton(sizes: list[int], batches: int, rate: float) -> list[dict]:
    from tokenrouter.launch.triton_install import build_backend_dir, find_triton
    from tokenrouter.launch.triton_server import Ports, TritonServer

    install = find_triton()
    with tempfile.TemporaryDirectory(prefix="peer-channel-") as tmp:
        repository = Path(tmp) / "repository"
        write_model(repository, model_config(SINK, backend="python", inputs=[SUBSERVER_INPUTS[PEER_INPUT]],
                                             decoupled=True), {"model.py": SINK_MODEL})
        server = TritonServer(repository, build_backend_dir(install, Path(tmp) / "backends", None), install,
                              Ports.free(), host="127.0.0.1", exit_timeout_s=5).start_ready(300)
        try:
            channel = TritonChannel(server.grpc_url)
            rows = [measure(channel, lambda: group_cpu_s(server.running.pid), size, batches, rate)
                    for size in sizes]
            channel.close()
            return rows
        finally:
            server.stop()


def run_grpcio(sizes: list[int], batches: int, rate: float) -> list[dict]:
    port = Ports_free()
    process = subprocess.Popen([sys.executable, "-m", "tokenrouter_tools.bench.peer_channel", "--serve-grpcio",
                                str(port)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        channel = GrpcioChannel(f"127.0.0.1:{port}")
        rows = [measure(channel, lambda: group_cpu_s(process.pid), size, batches, rate) for size in sizes]
        channel.close()
        return rows
    finally:
        process.kill()
        process.wait()


def Ports_free() -> int:  # noqa: N802 - one port, as Ports.free gives three
    from tokenrouter.launch.triton_server import Ports

    return Ports.free().grpc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=250.0, help="batches per second in the CPU run")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 16], help="messages per batch")
    parser.add_argument("--channels", nargs="+", default=["triton", "grpcio"], choices=["triton", "grpcio"])
    parser.add_argument("--serve-grpcio", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_grpcio:
        serve_grpcio(args.serve_grpcio)
        return 0
    runners = {"triton": run_triton, "grpcio": run_grpcio}
    result: dict[str, Any] = {"load_before": os.getloadavg()}
    for channel in args.channels:
        result[channel] = runners[channel](args.sizes, args.batches, args.rate)
    result["load_after"] = os.getloadavg()
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
