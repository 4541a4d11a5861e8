"""Calls that used to crash or hijack the server: straight to the internal models, forged peer messages.

Every one must end with a clear 4xx error on that call alone; the server stays up, other requests
finish as if nothing happened, the refusal is counted, and both KV pools end idle.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import time
from pathlib import Path

import pytest
from tritonclient.utils import InferenceServerException

from helpers.routing import PROMPTS, metrics, stream_ids, wait_for_idle_pools
from helpers.launcher import descendants
from helpers.cancellation import wait_until_held
from tokenrouter.client import grpc_stream, http_generate, http_post, inputs
from tokenrouter.protocol import PeerMessage, RequestSpec, encode_batch
from tokenrouter.serving.control import ControlCall
from tokenrouter.serving.peer_auth import REQUEST_KEY_PARAMETER, SECRET_PARAMETER, new_request_key
from tokenrouter.launch.processes import stub_pids


def _direct_stream(url: str, model: str, arrays: dict, parameters: dict | None = None) -> None:
    """One request over the gRPC stream to ``model`` (not a front); raises its error."""
    grpc_stream(url, arrays, model, parameters=parameters)


def _peer_input(messages: list[PeerMessage]) -> dict:
    return inputs(peer_message=encode_batch(messages))


def _server_alive_and_serving(server) -> None:
    time.sleep(0.5)  # the crash came after the 4xx, when the freed request was polled
    assert server.process.poll() is None, f"tritonserver died:\n{server.log_tail()}"
    reply = http_generate(server.http_url, {"text_input": PROMPTS[0], "max_tokens": 6})
    assert len(reply["output_ids"]) == 6


@pytest.mark.parametrize("model", ["llm", "slm"])
def test_token_request_straight_to_a_subserver_over_http_is_4xx_and_the_server_lives(routing_server, model):
    # llm is not the entry model; slm is internal (token ids go to tensorrt_llm), whatever the body
    body = {"input_ids": [1, 2, 3], "max_tokens": 4} if model == "llm" else {"input_ids": [1, 2, 3], "max_tokens": -4}
    status, text = http_post(routing_server.http_url, f"/v2/models/{model}/generate", body)
    assert 400 <= status < 500, (status, text)
    assert ("not the entry model" if model == "llm" else "'slm' is internal to this server: send token ids to "
            "'tensorrt_llm'") in json.loads(text)["error"]
    _server_alive_and_serving(routing_server)


def test_token_request_straight_to_llm_over_grpc_is_refused_and_the_server_lives(routing_server):
    with pytest.raises(InferenceServerException, match="not the entry model"):
        _direct_stream(routing_server.grpc_url, "llm", inputs(input_ids=[1, 2, 3], max_tokens=4))
    _server_alive_and_serving(routing_server)


def _forged_messages() -> list[tuple[str, list[PeerMessage]]]:
    """(target model, messages): an attacker guesses request ids (slm-0 .. slm-199)."""
    rids = [f"slm-{n}" for n in range(200)]
    spec = RequestSpec(prompt_len=1, max_tokens=300)
    return [
        ("slm", [PeerMessage(kind="ended", rid=rid, sender="llm", anchor=0, tokens=[7] * 591, finish_reason="length")
                 for rid in rids]),
        ("llm", [PeerMessage(kind="release", rid=rid, sender="slm") for rid in rids]),
        ("slm", [PeerMessage(kind="release", rid=rid, sender="llm") for rid in rids]),
        ("llm", [PeerMessage(kind="handoff", rid="slm-9999", sender="slm", anchor=5, tokens=[1, 2], origins=[-1, -1],
                             request=spec)]),
        ("llm", [PeerMessage(kind="handoff", rid=rid, sender="slm", anchor=0, tokens=[1] * 64, origins=[-1] * 64,
                             request=spec) for rid in rids[:50]]),
        ("slm", [PeerMessage(kind="active", rid="", sender="llm", active=10**6)]),
    ]


VICTIM_TOKENS = 400  # min_tokens too: no victim may end before the forgeries are all refused (128 did, with
# two test workers on two cores); prompt + 400 stays within the tiny pair's 512-token context


def _start_victims(pool: concurrent.futures.ThreadPoolExecutor, server) -> list[concurrent.futures.Future]:
    """4 streams of VICTIM_TOKENS, returned once the entry holds them all."""
    victims = [pool.submit(stream_ids, server, PROMPTS[i], max_tokens=VICTIM_TOKENS, min_tokens=VICTIM_TOKENS,
                           random_seed=i) for i in range(4)]
    wait_until_held(server, 4)
    return victims


def test_forged_peer_messages_are_refused_counted_and_change_nothing(routing_server):
    server = routing_server
    before = metrics(server)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        victims = _start_victims(pool, server)
        refused = 0
        for model, messages in _forged_messages():
            with pytest.raises(InferenceServerException, match="refused"):
                _direct_stream(server.grpc_url, model, _peer_input(messages))
            status, text = http_post(server.http_url, f"/v2/models/{model}/generate",
                                     {"peer_message": encode_batch(messages).decode()})
            assert 400 <= status < 500 and "refused" in text, (status, text)
            refused += 2
        assert not any(victim.done() for victim in victims), "the victims ended before the forgeries: longer ones"
        for victim in victims:
            ids, _, reason = victim.result(timeout=120)
            assert len(ids) == VICTIM_TOKENS and reason == "length"  # not ended, not hung, not stuffed with 591 tokens
    assert wait_for_idle_pools(server) == {}
    time.sleep(0.7)  # one metrics refresh
    after = metrics(server)
    counted = sum(after.get(k, 0) - before.get(k, 0) for k in after if k.startswith("tokenrouter_refused_peer_calls"))
    assert counted == refused
    _server_alive_and_serving(server)


FORGED_CONTROL_CALLS = [  # (the control input, the parameters)
    (ControlCall("cancel", keys=tuple(new_request_key() for _ in range(50))), {}),
    (ControlCall("cancel", keys=("x",)), {SECRET_PARAMETER: "a guessed secret"}),
    (ControlCall("shutdown"), {SECRET_PARAMETER: ""}),
    (ControlCall("drain"), {}),
]


def test_forged_control_calls_and_request_keys_are_refused_counted_and_change_nothing(routing_server):
    """The fronts' cancel (and the launcher's shutdown) are control calls a client can reach: without
    the secret they are refused and counted, and no victim stream ends early. A prompt that names
    itself with a request key (as only a front may) is refused the same way. Catches a cancel or a
    key that works without the secret."""
    server = routing_server
    before = metrics(server)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        victims = _start_victims(pool, server)
        for call, parameters in FORGED_CONTROL_CALLS:
            with pytest.raises(InferenceServerException, match="refused"):
                _direct_stream(server.grpc_url, "slm", {"control": call.row()}, parameters)
        with pytest.raises(InferenceServerException, match="refused"):
            _direct_stream(server.grpc_url, "slm", inputs(input_ids=[5, 6, 7], max_tokens=4),
                           {REQUEST_KEY_PARAMETER: new_request_key()})
        for call, parameters in FORGED_CONTROL_CALLS:  # the fronts take the launcher's calls too (the victims' front)
            with pytest.raises(InferenceServerException, match="is for this server's launcher; refused"):
                _direct_stream(server.grpc_url, "tokenrouter", {"control": call.row()}, parameters)
        assert not any(victim.done() for victim in victims), "the victims ended before the forgeries: longer ones"
        for victim in victims:
            ids, _, reason = victim.result(timeout=120)
            assert len(ids) == VICTIM_TOKENS and reason == "length"
    assert wait_for_idle_pools(server) == {}
    time.sleep(0.7)  # one metrics refresh
    after = metrics(server)
    counted = sum(after.get(k, 0) - before.get(k, 0) for k in after if k.startswith("tokenrouter_refused_peer_calls"))
    assert counted == len(FORGED_CONTROL_CALLS) + 1
    _server_alive_and_serving(server)


def test_a_prompt_straight_to_the_entry_is_refused_before_its_inputs_are_read(routing_server):
    """Every token banned (300k bad ids) used to reach the entry's checks; now no client prompt does: the
    entry refuses it by its parameters (no server secret), before reading an input."""
    every_token = [t for token in range(151_936) for t in (token, -1)]  # more than the tiny vocabulary
    start = time.monotonic()
    with pytest.raises(InferenceServerException, match="'slm' is internal to this server"):
        _direct_stream(routing_server.grpc_url, "slm", inputs(input_ids=[5, 6, 7], max_tokens=4, bad_ids=every_token))
    assert time.monotonic() - start < 2.0
    _server_alive_and_serving(routing_server)


@pytest.mark.xfail(strict=True, reason="Triton 2.51's HTTP frontend converts JSON numbers to the input's INT32 "
                   "before any model runs: 2**32+5 arrives as 5, 2**63 is a 500 'Unable to parse'. The models "
                   "cannot tell; see docs/reliability.md (open)")
@pytest.mark.parametrize("field,value", [("max_tokens", 2**32 + 5), ("top_k", 2**32 + 1), ("max_tokens", 2**63)])
def test_integer_overflow_over_http_is_refused_not_wrapped(routing_server, field, value):
    status, text = http_post(routing_server.http_url, "/v2/models/tokenrouter/generate",
                             {"text_input": PROMPTS[0], "max_tokens": 4} | {field: value})
    assert 400 <= status < 500, (status, text[:300])


def test_the_peer_secret_is_in_no_environment_and_no_model_config(routing_server):
    """Whatever a stub starts inherits its environment, and an environment leaks (a crash report, a
    debug dump, `ps e`); the secret forges every peer and control call. So it is in no process's
    environment (it once was in tritonserver's, hence in every stub's), and no model's config, as
    any client reads it, holds it; nor any command line (every local user reads those)."""
    secret = routing_server.peer_secret
    processes = [routing_server.process.pid, *descendants(routing_server.process.pid)]  # and what stubs start
    stubs = set(stub_pids(routing_server.process.pid).values())
    assert len(stubs) >= 7 and stubs <= set(processes), (stubs, processes)  # the fronts, subservers, text models
    for pid in processes:
        for part in ("environ", "cmdline"):
            assert secret.encode() not in Path(f"/proc/{pid}/{part}").read_bytes(), f"the secret is in {pid}/{part}"
    host, port = routing_server.http_url.rsplit(":", 1)
    for model in sorted(stub_pids(routing_server.process.pid)):
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        connection.request("GET", f"/v2/models/{model}/config")
        config = connection.getresponse().read().decode()
        assert model in config and secret not in config, model
