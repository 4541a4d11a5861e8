"""The TokenRouter engine for Dynamo, driven in-process with a stub context: no Dynamo processes.

Oracles: greedy tokens equal the embedded API's; a cancelled request ends on every model and its KV
balances to zero; each mapped field changes what the pair does (or what it is asked)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from dynamo.llm.exceptions import InvalidArgument
from tokenrouter import TokenRouter
from tokenrouter.fleet.engine import TokenRouterEngine
from tokenrouter.fleet.launcher import tiny_config
from tokenrouter.fleet.requests import map_request

pytestmark = pytest.mark.timeout(120)
PROMPT = [321, 784, 10, 67, 14, 301, 309]


class StubContext:
    """What the engine reads of Dynamo's per-request Context."""

    def __init__(self, rid: str) -> None:
        self._id = rid

    def id(self) -> str:
        return self._id

    def is_stopped(self) -> bool:
        return False


def request(max_tokens: int = 8, sampling: dict | None = None, stops: dict | None = None,
            output: dict | None = None, **extra) -> dict:
    return {"token_ids": list(PROMPT), "sampling_options": sampling or {},
            "stop_conditions": {"max_tokens": max_tokens, **(stops or {})}, "output_options": output or {}, **extra}


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_config(tmp_path_factory.mktemp("fleet"))


@pytest.fixture(scope="module")
def engine(config: Path):
    engine = TokenRouterEngine(config, "tokenrouter")
    loop = asyncio.new_event_loop()
    registration = loop.run_until_complete(engine.start(0))
    engine.loop, engine.registration = loop, registration
    yield engine
    loop.run_until_complete(engine.cleanup())
    loop.close()


def collect(engine: TokenRouterEngine, req: dict, rid: str = "r") -> list[dict]:
    async def run() -> list[dict]:
        return [chunk async for chunk in engine.generate(req, StubContext(rid))]
    return engine.loop.run_until_complete(run())


def test_registration_names_the_pair(engine):
    assert engine.registration.served_model_name == "tokenrouter"
    assert engine.registration.llm.context_length == engine.router.max_model_len


def test_greedy_tokens_equal_the_embedded_api_and_the_last_chunk_carries_the_ending(engine, config):
    chunks = collect(engine, request(max_tokens=12, stops={"ignore_eos": True}))
    tokens = [t for chunk in chunks for t in chunk["token_ids"]]
    with TokenRouter.from_config(config) as reference:
        expected = reference.generate([PROMPT], max_tokens=12)[0]
    assert tokens == expected.token_ids
    last = chunks[-1]
    assert last["finish_reason"] == "length" and all("finish_reason" not in c for c in chunks[:-1])
    assert last["completion_usage"] == {"prompt_tokens": len(PROMPT), "completion_tokens": 12,
                                        "total_tokens": len(PROMPT) + 12}
    models = [m for chunk in chunks for m in chunk["engine_data"]["models"]]
    assert models == expected.models == last["engine_data"]["response_models"]
    assert last["engine_data"]["large_model_share"] == pytest.approx(expected.large_model_share)


def test_responses_are_paced_by_the_live_streams_share_of_the_budget(engine, monkeypatch):
    """One stream with a budget of 0.05 responses/s is paced 20 s apart: its first token leaves alone
    and the rest (ending included) at once in one more response, the same tokens as unpaced."""
    unpaced = collect(engine, request(12, stops={"ignore_eos": True}))
    monkeypatch.setattr(engine.router.config.scheduling, "max_responses_per_s", 0.05)
    started = time.monotonic()
    paced = collect(engine, request(12, stops={"ignore_eos": True}))
    assert time.monotonic() - started < 10  # the ending was not held for the pace
    assert [t for c in paced for t in c["token_ids"]] == [t for c in unpaced for t in c["token_ids"]]
    assert len(paced) <= 2 and paced[-1]["finish_reason"] == "length"


def test_sampling_fields_reach_the_pair(engine, config):
    sampled = {"temperature": 1.0, "top_k": 20, "top_p": 0.9, "seed": 7, "repetition_penalty": 1.1,
               "presence_penalty": 0.2, "frequency_penalty": 0.1}
    tokens = [t for c in collect(engine, request(12, sampled, {"ignore_eos": True})) for t in c["token_ids"]]
    with TokenRouter.from_config(config) as reference:
        same = reference.generate([PROMPT], max_tokens=12, ignore_eos=True, **sampled)[0].token_ids
        other_seed = reference.generate([PROMPT], max_tokens=12, ignore_eos=True, **{**sampled, "seed": 8})[0]
    assert tokens == same != other_seed.token_ids


def test_stop_token_ids_end_the_request_and_min_tokens_holds_them_off(engine):
    free = [t for c in collect(engine, request(12, stops={"ignore_eos": True})) for t in c["token_ids"]]
    stop_at = free[3]
    stopped = collect(engine, request(12, stops={"stop_token_ids": [stop_at], "ignore_eos": True}))
    tokens = [t for c in stopped for t in c["token_ids"]]
    assert tokens == free[:free.index(stop_at) + 1] and stopped[-1]["finish_reason"] == "eos"
    held = [t for c in collect(engine, request(12, stops={"stop_token_ids": [stop_at], "ignore_eos": True,
                                                           "min_tokens": 12})) for t in c["token_ids"]]
    assert len(held) == 12 and stop_at not in held


def test_ignore_eos_runs_past_the_end_ids():
    mapped = map_request(request(stops={"ignore_eos": True, "stop_token_ids_hidden": None}))
    assert mapped.keywords["ignore_eos"] is True
    assert map_request(request(stops={"stop_token_ids_hidden": [2, 0]})).keywords["stop_token_ids"] == [2, 0]
    assert map_request(request(stops={"min_tokens": 3})).keywords["min_tokens"] == 3


def test_logprobs_are_per_token(engine):
    chunks = collect(engine, request(6, {"temperature": 1.0, "seed": 1}, {"ignore_eos": True}, {"logprobs": 0}))
    assert all(len(c["log_probs"]) == len(c["token_ids"]) for c in chunks)
    assert sum(len(c["log_probs"]) for c in chunks) == 6 and any(lp < 0 for c in chunks for lp in c["log_probs"])
    assert all("log_probs" not in c for c in collect(engine, request(3)))


@pytest.mark.parametrize("req, field", [
    (request(sampling={"min_p": 0.5}), "min_p"),
    (request(sampling={"n": 2}), "n=2"),
    (request(sampling={"guided_decoding": {"json": {}}}), "guided_decoding"),
    (request(sampling={"use_beam_search": True}), "use_beam_search"),
    (request(output={"logprobs": 5}), "logprobs=5"),
    (request(output={"prompt_logprobs": 1}), "prompt_logprobs"),
    (request(extra_args={"sampling_options": {"x": 1}}), "extra_args"),
    (request(token_ids=[]), "token_ids"),
])
def test_unsupported_fields_are_refused_by_name(req, field):
    with pytest.raises(InvalidArgument, match=field):
        map_request(req)


def test_neutral_values_pass():
    mapped = map_request(request(sampling={"n": 1, "min_p": 0.0, "use_beam_search": False},
                                 output={"skip_special_tokens": True}, extra_args={"nvext": {"extra_fields": []}},
                                 eos_token_ids=[2, 0], mdc_sum="x", annotations=[], routing={}))
    assert mapped.prompt == PROMPT


def test_bad_values_found_at_submit_are_invalid_argument(engine):
    with pytest.raises(InvalidArgument, match="top_p"):
        collect(engine, request(sampling={"top_p": 3.0}))
    with pytest.raises(InvalidArgument, match="vocab|token"):
        collect(engine, {"token_ids": [10 ** 9], "stop_conditions": {"max_tokens": 2}})
    assert collect(engine, request(3))[-1]["finish_reason"] == "length"  # the engine goes on


def test_abort_cancels_on_every_model_and_frees_their_kv(engine):
    async def run() -> tuple[list[dict], dict[str, int]]:
        context = StubContext("to-abort")
        stream = engine.generate(request(900, stops={"ignore_eos": True}), context)
        seen: list[dict] = []
        async for chunk in stream:
            seen.append(chunk)
            if any(m == "llm" for c in seen for m in c["engine_data"]["models"]):
                break
        held = engine.router.kv_blocks_used()
        await engine.abort(context)
        rest = [chunk async for chunk in stream]
        return seen + rest, held

    chunks, held = engine.loop.run_until_complete(run())
    assert held["slm"] > 0 and held["llm"] > 0  # both models held the request's KV
    assert sum(len(c["token_ids"]) for c in chunks) < 900 and chunks[-1]["finish_reason"] == "cancelled"
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline and (any(engine.router.kv_blocks_used().values())
                                           or any(engine.router.held_requests().values())):
        time.sleep(0.02)
    assert engine.router.kv_blocks_used() == {"slm": 0, "llm": 0}
    assert engine.router.held_requests() == {"slm": 0, "llm": 0}


def test_health_check_payload_is_served(engine):
    payload = engine.loop.run_until_complete(engine.health_check_payload())
    chunks = collect(engine, payload)
    assert chunks[-1]["finish_reason"] == "length" and chunks[-1]["completion_usage"]["completion_tokens"] == 1
