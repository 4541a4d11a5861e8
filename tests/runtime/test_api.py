"""The embedded API: text prompts, streaming, cancellation, stop strings, bad input, shutdown,
and a three-model configuration."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Sequence

import pytest

from tokenrouter import ServerBusy, TokenRouter
from tokenrouter.policies.base import RequestView, RoutingPolicy, StepResult, register_policy, registered_policies
from tokenrouter.runtime.api import GenerationError
from tokenrouter.protocol import RequestSpec
from tokenrouter.runtime.assembly import build_policy
from tokenrouter.runtime.reference import reference_generate
from tokenrouter.request_builder import RequestError


@pytest.fixture(scope="module")
def engine(tiny_config):
    with TokenRouter.from_config(tiny_config("random", {"rate": 0.3, "seed": 2})) as engine:
        yield engine


def test_text_prompt_roundtrip_and_attribution(engine):
    result = engine.generate("def add(a, b):", max_tokens=12)[0]
    assert result.finish_reason in ("length", "eos")
    assert len(result.models) == len(result.token_ids) > 0
    assert set(result.models) <= {"slm", "llm"}
    assert result.text == engine.codec.decode(result.token_ids)
    assert result.large_model_share == sum(m == "llm" for m in result.models) / len(result.models)


def test_stream_chunks_add_up_to_generate(engine):
    async def collect():
        return [chunk async for chunk in engine.stream("import os\n", max_tokens=16, seed=3)]

    chunks = asyncio.run(collect())
    whole = engine.generate("import os\n", max_tokens=16, seed=3)[0]
    assert [t for c in chunks for t in c.token_ids] == whole.token_ids
    assert [m for c in chunks for m in c.models] == whole.models
    assert "".join(c.text for c in chunks) == whole.text
    assert chunks[-1].finish_reason == whole.finish_reason and all(c.finish_reason is None for c in chunks[:-1])


def test_paced_stream_merges_tokens_and_never_holds_the_last_chunk(engine):
    """A pace far longer than the request: the first chunk leaves at once, everything after it in
    one last chunk as soon as the request ends (a held end would take the whole pace), no text."""
    async def collect():
        stream = engine.stream("import os\n", max_tokens=16, seed=3, pace=lambda: 60.0, text=False)
        return [chunk async for chunk in stream]

    chunks = asyncio.run(asyncio.wait_for(collect(), timeout=20))
    whole = engine.generate("import os\n", max_tokens=16, seed=3)[0]
    assert [t for c in chunks for t in c.token_ids] == whole.token_ids
    assert [m for c in chunks for m in c.models] == whole.models
    assert len(chunks) <= 2 < len(whole.token_ids)
    assert chunks[-1].finish_reason == whole.finish_reason and all(c.text is None for c in chunks)


def test_sampling_is_reproducible_per_seed(engine):
    first = engine.generate(["x = 1"] * 2, max_tokens=12, temperature=0.9, top_p=0.9, seed=[5, 6])
    again = engine.generate(["x = 1"] * 2, max_tokens=12, temperature=0.9, top_p=0.9, seed=[5, 6])
    assert [r.token_ids for r in first] == [r.token_ids for r in again]


def test_cancel_mid_stream_frees_everything(engine):
    async def read_two_chunks():
        # aclosing: leaving the loop closes the stream at once, which cancels the request.
        async with contextlib.aclosing(engine.stream([7, 8, 9], max_tokens=400)) as stream:
            async for index, _ in _aenumerate(stream):
                if index == 1:
                    return

    asyncio.run(read_two_chunks())
    handle = engine.submit([4, 5], max_tokens=400)
    handle.cancel()
    assert handle.wait(30).finish_reason == "cancelled"
    _wait_idle(engine)
    assert engine.kv_blocks_used() == {"slm": 0, "llm": 0}


def test_stop_string_ends_generation(engine):
    free = engine.generate("def f(x):", max_tokens=30)[0]
    stop = engine.codec.decode(free.token_ids[3:5])
    assert stop, "need a non-empty stop string"
    stopped = engine.generate("def f(x):", max_tokens=30, stop=[stop])[0]
    assert stopped.finish_reason == "stop"
    assert len(stopped.token_ids) <= 5 + 2
    assert stopped.token_ids == free.token_ids[:len(stopped.token_ids)]


@pytest.mark.parametrize("kwargs,match", [
    ({"prompt": ""}, "empty"),
    ({"prompt": []}, "empty"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 10**7}, "exceeds the context"),
    ({"prompt": [1] * 100_000}, "limit"),
    ({"prompt": "x", "temperature": -1}, "temperature"),
    ({"prompt": "x", "top_p": -0.1}, "top_p"),
    ({"prompt": "x", "top_p": 1.5}, "top_p"),
    ({"prompt": "x", "top_p": float("nan")}, "top_p"),
    ({"prompt": "x", "repetition_penalty": float("nan")}, "repetition_penalty"),
    ({"prompt": "x", "repetition_penalty": 0.0}, "repetition_penalty"),
    ({"prompt": "x", "repetition_penalty": "2"}, "repetition_penalty"),
    ({"prompt": "x", "presence_penalty": float("inf")}, "presence_penalty"),
    ({"prompt": "x", "presence_penalty": float("nan")}, "presence_penalty"),
    ({"prompt": "x", "frequency_penalty": float("-inf")}, "frequency_penalty"),
    ({"prompt": "x", "frequency_penalty": None}, "frequency_penalty"),
    ({"prompt": "x", "min_tokens": -1}, "min_tokens"),
    ({"prompt": "x", "min_tokens": 2.5}, "min_tokens"),
    ({"prompt": "x", "logit_bias": [(10**9, 1.0)]}, "logit_bias token id"),
    ({"prompt": "x", "logit_bias": [(-1, 1.0)]}, "logit_bias token id"),
    ({"prompt": "x", "logit_bias": [(3, float("nan"))]}, "logit_bias weight"),
    ({"prompt": "x", "logit_bias": [(3, float("inf"))]}, "logit_bias weight"),
    ({"prompt": "x", "logit_bias": [(3,)]}, "logit_bias"),
    ({"prompt": "x", "logit_bias": [(3.5, 1.0)]}, "logit_bias token id"),
    ({"prompt": "x", "return_log_probs": "yes"}, "return_log_probs"),
    ({"prompt": [1.5, 2]}, "token ids"),
    ({"prompt": [10**9]}, "token ids"),
])
def test_bad_input_is_refused_and_others_go_on(engine, kwargs, match):
    good = engine.submit([3, 4, 5], max_tokens=8)
    prompt = kwargs.pop("prompt")
    with pytest.raises(RequestError, match=match):
        engine.submit(prompt, **kwargs)
    assert good.wait(30).finish_reason in ("length", "eos")


@pytest.mark.parametrize("prompts", [["x = 1", 3], [3, "x = 1"], [[3, 4], 5]])
def test_a_batch_mixing_token_ids_with_prompts_is_refused(engine, prompts):
    with pytest.raises(RequestError, match="a prompt must be a string or a sequence of int token ids"):
        engine.generate(prompts, max_tokens=4)


def test_shutdown_ends_requests_in_flight(tiny_config):
    engine = TokenRouter.from_config(tiny_config("slm_only"))
    handles = [engine.submit([3, 4, 5], max_tokens=2000) for _ in range(4)]
    engine.shutdown()
    assert all(h.wait(10).finish_reason in ("error", "length", "eos") for h in handles)
    with pytest.raises(RuntimeError, match="shut down"):
        engine.submit([1], max_tokens=2)


def test_a_full_queue_refuses_submit_and_generate_feeds_a_larger_batch_in(tiny_config):
    """A submit past scheduling.max_queue raises ServerBusy at once while the admitted and queued
    requests finish; generate() of a batch larger than the queue waits for its own requests
    instead. Catches an unbounded queue, and a generate() that fails a big batch."""
    config = tiny_config("slm_only", max_active=1)
    config["scheduling"]["max_queue"] = 2
    with TokenRouter.from_config(config) as engine:
        handles = []
        with pytest.raises(ServerBusy, match=r"requests queued \(max_queue 2\)"):
            for _ in range(8):  # a burst: two wait (one may be admitted meanwhile), the next is refused
                handles.append(engine.submit([3, 4, 5], max_tokens=200))
        assert 2 <= len(handles) <= 3  # 3 when the loop admitted the first before the third came
        assert all(h.wait(60).finish_reason in ("length", "eos") for h in handles)
        results = engine.generate([[3, 4, 5]] * 7, max_tokens=4, timeout=60)
        assert [r.finish_reason in ("length", "eos") for r in results] == [True] * 7


class RoundRobin(RoutingPolicy):
    """Each token from the next model in turn: exercises three subservers and two-hop handoffs."""

    name = "test_round_robin"

    def route(self, batch: Sequence[RequestView], out: StepResult) -> list[str]:
        return [self.models[(self.index(r.model) + 1) % len(self.models)] for r in batch]


if "test_round_robin" not in registered_policies():
    register_policy(RoundRobin)


def test_three_models_match_the_reference(tiny_pair, tiny_config, mixed_prompts, references):
    config = tiny_config("test_round_robin")
    config["models"]["mid"] = dict(config["models"]["llm"], path=str(tiny_pair["small"]))
    prompts = mixed_prompts(6, seed=9)
    with TokenRouter.from_config(config) as engine:
        results = engine.generate(prompts, max_tokens=10)
        forwards = {**references, "mid": references["slm"]}  # "mid" runs the small model's weights
        for prompt, result in zip(prompts, results):
            spec = RequestSpec(prompt_len=len(prompt), max_tokens=10,
                               end_ids=sorted(engine.engines["slm"].eos_token_ids))
            tokens, origins, _ = reference_generate(forwards, build_policy(engine.config), "slm", prompt, spec,
                                                    max_model_len=engine.max_model_len)
            assert result.token_ids == tokens
            assert result.models[:3] == ["slm", "llm", "mid"][:len(result.models[:3])]
        _wait_idle(engine)
        assert set(engine.kv_blocks_used().values()) == {0}


def _wait_idle(engine, timeout: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (any(engine.kv_blocks_used().values())
                                           or any(engine.held_requests().values())):
        time.sleep(0.02)


async def _aenumerate(iterator):
    index = 0
    async for item in iterator:
        yield index, item
        index += 1


class Nowhere(RoutingPolicy):
    """Routes every request to a model that does not exist: every request fails."""

    name = "test_nowhere"

    def route(self, batch: Sequence[RequestView], out: StepResult) -> list[str]:
        return ["nowhere" for _ in batch]


if "test_nowhere" not in registered_policies():
    register_policy(Nowhere)


def test_stream_raises_generation_error(tiny_config):
    with TokenRouter.from_config(tiny_config("test_nowhere")) as engine:
        async def run():
            async for _ in engine.stream([1, 2, 3], max_tokens=3):
                pass

        with pytest.raises(GenerationError, match="unknown model 'nowhere'"):
            asyncio.run(run())
        result = engine.generate([1, 2, 3], max_tokens=3)[0]
        assert result.finish_reason == "error" and "nowhere" in result.error
