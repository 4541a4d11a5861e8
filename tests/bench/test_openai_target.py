"""The streamed OpenAI target against a small SSE server: a request still streaming at the deadline
is cut there (its connection closed, so the server stops), and the next request works."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest

from tokenrouter_tools.bench.openai_target import OpenAITarget

EVENTS, EVERY_S = 200, 0.02


class SlowStream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as vLLM's and our OpenAI servers speak
    written: list[int] = []  # events each request got out before its client went away

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        count = min(body["max_tokens"], EVENTS)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        sent = 0
        try:
            for index in range(count):
                last = index == count - 1
                chunk = {"choices": [{"text": "x", "finish_reason": "length" if last else None,
                                      "large_model_share": 0.5}],
                         "usage": {"completion_tokens": index + 1}}
                self._chunk(f"data: {json.dumps(chunk)}\n\n")
                sent += 1
                time.sleep(EVERY_S)
            self._chunk("data: [DONE]\n\n")
            self._chunk("")
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            SlowStream.written.append(sent)

    def _chunk(self, text: str) -> None:
        data = text.encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def url() -> Iterator[str]:
    SlowStream.written = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowStream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_request_streaming_at_the_deadline_is_cut_there_and_the_next_one_runs(url: str) -> None:
    target = OpenAITarget(url, "llm", entry="slm")
    start = time.monotonic()
    cut = target.generate("p", max_tokens=EVENTS, seed=0, deadline=start + 0.3)
    assert time.monotonic() - start < 1.5  # not the 4 s the whole stream takes
    assert cut.finish_reason == "cancelled" and not cut.complete
    assert 5 <= cut.output_tokens < EVENTS / 2
    assert not cut.tokens_by_model  # its share comes with the last chunk: unknown
    whole = target.generate("p", max_tokens=5, seed=0, deadline=float("inf"))
    assert whole.finish_reason == "length" and whole.output_tokens == 5 and whole.complete
    assert whole.tokens_by_model == {"llm": 2, "slm": 3}  # round(0.5 * 5) by the large model
    target.close()
    deadline = time.monotonic() + 5
    while len(SlowStream.written) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert SlowStream.written[0] < EVENTS / 2  # the server stopped writing the cut one
