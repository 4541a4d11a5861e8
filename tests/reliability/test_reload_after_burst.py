"""An operator's reload under `tokenrouter serve` (SIGHUP: a config edit applies) after a burst whose
clients left their 20 gRPC streams open, with requests still in flight: no request is lost. The
fronts refuse new requests by state (the reason says to retry), those in flight finish whole, then
tritonserver starts again on the same ports with the edited config. No front is unloaded: Triton 2.51
never finishes an unload of a front that clients keep streams open to (the server used to be killed
after 10 s, and every request in flight with it)."""

from __future__ import annotations

import concurrent.futures
import signal
import time

import pytest
from tritonclient.utils import InferenceServerException

from helpers.routing import PROMPTS
from helpers.supervised import Supervised
from tokenrouter.client import GrpcStream, grpc_stream, http_generate, inputs

OPEN_STREAMS, IN_FLIGHT, MAX_TOKENS = 20, 6, 200
RELOADING = "reload: refusing new requests"
RELOAD_REASON = "the server is restarting to apply a configuration change; try again"


def test_a_reload_after_a_burst_with_twenty_open_streams_loses_no_request_and_applies_the_edit(
        supervised_launcher: Supervised) -> None:
    served = supervised_launcher
    served.wait_ready()
    launcher, url = served.process, served.grpc_url
    reloads, ready, timed_out = (served.count(text) for text in (RELOADING, "ready again", "drain timed out"))
    streams = [GrpcStream(url) for _ in range(OPEN_STREAMS)]
    config = served.repository / "tokenrouter" / "config.pbtxt"
    original = config.read_text()
    try:
        old_server = served.server_pid()
        for i, stream in enumerate(streams):  # the burst: answered, and its streams stay open
            stream.send(inputs(text_input=PROMPTS[i % len(PROMPTS)], stream=True, max_tokens=8, min_tokens=8))
        for stream in streams:
            assert sum(reply["output_ids"].size for reply in stream.replies(timeout_s=120)) == 8
        # the edit: at most 2 sequences per request
        edited = config.read_text().replace('key: "max_return_sequences"\n  value {\n    string_value: "16"',
                                            'key: "max_return_sequences"\n  value {\n    string_value: "2"')
        assert edited != config.read_text()
        config.write_text(edited)
        with concurrent.futures.ThreadPoolExecutor(IN_FLIGHT) as pool:
            flying = [pool.submit(grpc_stream, url, inputs(text_input=PROMPTS[i % len(PROMPTS)], stream=True,
                                                           max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS,
                                                           random_seed=i), timeout_s=300)
                      for i in range(IN_FLIGHT)]
            time.sleep(1.0)
            assert not any(f.done() for f in flying), "requests finished before the reload"
            launcher.send_signal(signal.SIGHUP)
            served.wait_for(RELOADING, reloads + 1, 30)
            time.sleep(0.5)
            with pytest.raises(InferenceServerException, match=RELOAD_REASON):
                grpc_stream(url, inputs(text_input="x", max_tokens=2), timeout_s=30)
            for request in flying:  # every one finished whole: none cut by the reload
                responses = request.result(timeout=300)
                reason = responses[-1]["finish_reason"].reshape(-1)[0]
                assert (reason, sum(r["output_ids"].size for r in responses)) == (b"length", MAX_TOKENS)
        served.wait_for("ready again", ready + 1, 300)
        assert served.count("drain timed out") == timed_out, "".join(served.lines[-30:])
        assert served.server_pid() != old_server
        reply = http_generate(served.http_url, {"text_input": PROMPTS[0], "max_tokens": 4})
        assert len(reply["output_ids"]) == 4
        with pytest.raises(InferenceServerException, match="over the limit of 2"):  # the edit applied
            grpc_stream(url, inputs(text_input=PROMPTS[0], stream=True, max_tokens=4, num_return_sequences=3))
    finally:
        for stream in streams:
            stream.close()
        config.write_text(original)  # applies at the shared server's next start
