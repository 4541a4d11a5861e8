"""The simulated engine: the Engine contract, exact references, realistic signals, profiled latency."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from tokenrouter.config import ModelSpec
from tokenrouter.engine.base import KVCacheExhausted, SamplingParams, StepRow, UnknownSequence
from tokenrouter.engine.sampling import sample_tokens
from tokenrouter.engine.sim_profile import PROFILES, resolve_profile
from tokenrouter.engine.simulated import SimulatedEngine
from tokenrouter.policies.r_stitch import normalized_entropy

FAST = {"base": "tiny-cpu-small", "time_scale": 0.0}


@pytest.fixture
def engine() -> SimulatedEngine:
    spec = ModelSpec(engine="simulated", profile=FAST, block_size=4, kv_cache_tokens=64)  # 16 blocks
    return SimulatedEngine.from_spec("slm", spec)


def greedy_walk(engine: SimulatedEngine, prompt: list[int], steps: int) -> list[int]:
    """Greedy continuation computed from the pure reference, one full context at a time."""
    context = list(prompt)
    for _ in range(steps):
        context.append(int(engine.reference_logits(context).argmax()))
    return context[len(prompt):]


def test_shape_facts(engine: SimulatedEngine) -> None:
    assert (engine.vocab_size, engine.hidden_size, engine.max_model_len) == (512, 32, 4096)
    assert engine.eos_token_ids == {511}
    assert (engine.block_size, engine.num_total_blocks, engine.num_free_blocks) == (4, 16, 16)
    assert engine.can_fit(64) and not engine.can_fit(65)


def test_outputs_hidden_and_top_logits(engine: SimulatedEngine) -> None:
    prompts = {"x": [5, 6, 7, 8, 9], "y": [10, 11]}
    for seq_id in prompts:
        engine.add_sequence(seq_id)
    result = engine.step([StepRow(k, v) for k, v in prompts.items()], return_hidden=True, top_logits=3)
    assert result.seq_ids == ["x", "y"] and result.positions.tolist() == [5, 2]
    assert result.logits.dtype == torch.float32 and result.logits.shape == (2, 512)
    assert result.hidden.shape == (2, 32)
    top = torch.topk(result.logits, 3)
    assert torch.equal(result.topk_values, top.values) and torch.equal(result.topk_indices, top.indices)
    assert torch.equal(result.sampled, top.indices[:, 0])
    for row, tokens in enumerate(prompts.values()):
        logits, hidden = engine.reference(tokens)
        assert torch.equal(result.logits[row], logits) and torch.equal(result.hidden[row], hidden)
    assert engine.step([StepRow("x", [1])]).hidden is None


def test_incremental_steps_equal_the_full_recompute_reference(engine: SimulatedEngine) -> None:
    # Prefill, decodes of the engine's own tokens, and extends by tokens "another model" wrote,
    # each step in a batch with a stranger.
    engine.add_sequence("a")
    engine.add_sequence("other")
    context: list[int] = []
    sampled = 0
    for chunk in ([3, 1, 4, 1, 5, 9, 2, 6], None, None, [77, 78, 79], None, [80], None):
        new = [sampled] if chunk is None else chunk
        context += new
        result = engine.step([StepRow("a", new), StepRow("other", [len(context)])])
        assert torch.equal(result.logits[0], engine.reference_logits(context))
        assert engine.num_cached("a") == len(context)
        sampled = int(result.sampled[0])


def test_batch_composition_never_changes_a_row(engine: SimulatedEngine) -> None:
    engine.add_sequence("alone")
    alone = engine.step([StepRow("alone", [9, 8, 7])]).logits[0]
    for seq_id in ("a", "b"):
        engine.add_sequence(seq_id)
    crowd = engine.step([StepRow("a", [1, 2]), StepRow("b", [9, 8, 7])]).logits[1]
    assert torch.equal(alone, crowd)


def test_context_memory_is_bounded(engine: SimulatedEngine) -> None:
    engine.add_sequence("a")
    engine.step([StepRow("a", list(range(40)))])
    assert len(engine._tails["a"]) == engine.profile.window


def test_models_differ_but_agree_on_easy_positions() -> None:
    small = SimulatedEngine("slm", {"base": "a100-r2r-0.6b", "time_scale": 0.0})
    large = SimulatedEngine("llm", {"base": "a100-r2r-32b", "time_scale": 0.0})
    context = [1, 2, 3]
    agree = 0
    for _ in range(400):
        a, b = small.reference_logits(context), large.reference_logits(context)
        assert not torch.equal(a, b)
        agree += int(a.argmax() == b.argmax())
        context.append(int(a.argmax()))
    assert 0.5 < agree / 400 < 0.8  # ~ 1 - hard_rate(small) - hard_rate(large)


@pytest.mark.parametrize("name, hard_rate", [("a100-r2r-0.6b", 0.35), ("a100-r2r-32b", 0.05), ("custom", 0.1)])
def test_entropy_routing_fraction_follows_hard_rate(name: str, hard_rate: float) -> None:
    profile = {"hard_rate": hard_rate} if name == "custom" else {"base": name}
    engine = SimulatedEngine(name, profile | {"time_scale": 0.0})
    context = [7, 7, 7]
    high = []
    for _ in range(1500):
        logits = engine.reference_logits(context)
        high.append(float(normalized_entropy(logits[None])[0]))
        context.append(int(logits.argmax()))
    # R-Stitch's tau = 0.03 and a much looser tau route about the same fraction: a clear gap.
    for tau in (0.03, 0.2):
        assert sum(h > tau for h in high) / len(high) == pytest.approx(hard_rate, abs=0.04)


@pytest.mark.parametrize("eos_rate, low, high", [(0.001, 0.0, 0.01), (0.05, 0.03, 0.07)])
def test_eos_rate(eos_rate: float, low: float, high: float) -> None:
    engine = SimulatedEngine("m", {"eos_rate": eos_rate, "time_scale": 0.0})
    tokens = greedy_walk(engine, [1, 2, 3], 1500)
    assert low <= tokens.count(511) / len(tokens) <= high
    assert max(tokens) < engine.vocab_size


def test_sampling_is_reproducible_and_matches_the_reference(engine: SimulatedEngine) -> None:
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=11)
    engine.add_sequence("s")
    prompt = [4, 5, 6]
    result = engine.step([StepRow("s", prompt, params)])
    expected = sample_tokens(engine.reference_logits(prompt)[None], [params], [len(prompt)])
    assert torch.equal(result.sampled, expected)


def test_exhaustion_is_reported_and_changes_nothing(engine: SimulatedEngine) -> None:
    engine.add_sequence("big")
    engine.step([StepRow("big", list(range(3, 53)))])  # 13 of 16 blocks
    engine.add_sequence("new")
    with pytest.raises(KVCacheExhausted):
        engine.step([StepRow("big", [60]), StepRow("new", list(range(100, 116)))])  # needs 4 more
    assert engine.num_cached("big") == 50 and engine.num_cached("new") == 0 and engine.num_free_blocks == 3
    after = engine.step([StepRow("big", [60])])
    assert torch.equal(after.logits[0], engine.reference_logits(list(range(3, 53)) + [60]))
    assert engine.release("big") and engine.release("new") and engine.num_used_blocks == 0


@pytest.mark.parametrize(
    "rows, kwargs, error",
    [
        ([], {}, ValueError),
        ([StepRow("a", [])], {}, ValueError),
        ([StepRow("a", [5]), StepRow("a", [6])], {}, ValueError),
        ([StepRow("a", [5]), StepRow("ghost", [6])], {}, UnknownSequence),
        ([StepRow("a", [512])], {}, ValueError),
        ([StepRow("a", [-1])], {}, ValueError),
        ([StepRow("a", [1.5])], {}, ValueError),
        ([StepRow("a", [5] * 4094)], {}, ValueError),
        ([StepRow("a", [5])], {"top_logits": -1}, ValueError),
        ([StepRow("a", [5])], {"top_logits": 513}, ValueError),
    ],
    ids=["no-rows", "empty-row", "duplicate", "unknown", "token-too-big", "negative-token", "float-token",
         "past-max-model-len", "negative-top", "top-above-vocab"],
)
def test_bad_steps_raise_and_change_nothing(engine: SimulatedEngine, rows, kwargs, error) -> None:
    engine.add_sequence("a")
    engine.step([StepRow("a", [7, 8, 9])])
    with pytest.raises(error):
        engine.step(rows, **kwargs)
    assert engine.num_cached("a") == 3 and engine.num_used_blocks == 1


def test_profiles() -> None:
    assert PROFILES["a100-r2r-0.6b"].step_ms(1, 1) == pytest.approx(6.0)
    assert PROFILES["a100-r2r-32b"].step_ms(1, 1) == pytest.approx(27.9)
    assert PROFILES["a100-r2r-32b"].step_ms(4, 4) < 1.1 * 27.9  # a mild batch slope
    with pytest.raises(ValueError, match="unknown simulated profile"):
        resolve_profile("h100-imaginary")
    with pytest.raises(ValueError, match="unknown keys"):
        resolve_profile({"decode_ms": 3})
    with pytest.raises(ValueError, match="base_ms"):
        resolve_profile({"base_ms": "fast"})
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        resolve_profile({"hard_rate": 2})


def test_recorded_latency_follows_the_profile() -> None:
    engine = SimulatedEngine("m", {"base_ms": 2.0, "per_row_ms": 0.5, "per_token_ms": 0.1, "time_scale": 0.0})
    for seq_id in ("a", "b", "c"):
        engine.add_sequence(seq_id)
    engine.step([StepRow("a", list(range(11))), StepRow("b", [1]), StepRow("c", [1, 2])])  # 14 tokens, 3 rows
    assert engine.last_latency_s == pytest.approx((2.0 + 0.5 * 3 + 0.1 * 11) / 1e3)
    engine.step([StepRow("a", [1])])
    assert engine.total_latency_s == pytest.approx((4.6 + 2.5) / 1e3) and engine.num_steps == 2


def test_steps_sleep_at_least_the_profiled_latency() -> None:
    engine = SimulatedEngine("m", {"base_ms": 30.0})
    engine.add_sequence("a")
    started = time.perf_counter()
    engine.step([StepRow("a", [1])])
    assert time.perf_counter() - started >= 0.030


def test_two_models_on_two_threads_overlap() -> None:
    # Sleeping releases the GIL: two 50 ms models stepping 4 times each take ~200 ms, not 400.
    engines = [SimulatedEngine(name, {"base_ms": 50.0}) for name in ("slm", "llm")]

    def run(engine: SimulatedEngine) -> None:
        engine.add_sequence("a")
        for token in range(4):
            engine.step([StepRow("a", [token])])

    threads = [threading.Thread(target=run, args=(engine,)) for engine in engines]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert time.perf_counter() - started < 0.34


def test_routed_runtime_output_equals_the_naive_reference_on_simulated_models() -> None:
    # The use the engine exists for: the runtime at speed, with B = auto, checked token for token
    # against one-request-at-a-time full recomputation through ``reference``.
    from tokenrouter.runtime.api import TokenRouter
    from tokenrouter.protocol import RequestSpec
    from tokenrouter.runtime.assembly import build_policy
    from tokenrouter.runtime.reference import reference_generate

    config = {"models": {"slm": {"engine": "simulated", "profile": "tiny-cpu-small", "batch_threshold": "auto"},
                         "llm": {"engine": "simulated", "profile": "tiny-cpu-large", "batch_threshold": "auto"}},
              "policy": {"name": "r_stitch", "params": {"threshold": 0.03}},
              "scheduling": {"max_active": 4}}
    prompts = [[(7 * i + 3 * j) % 500 for j in range(1 + 3 * i)] for i in range(8)]
    with TokenRouter.from_config(config) as runtime:
        results = runtime.generate(prompts, max_tokens=32, timeout=120)
        forwards = {name: runtime.engines[name].reference for name in ("slm", "llm")}
        end_ids = sorted(runtime.engines["slm"].eos_token_ids)
        for prompt, result in zip(prompts, results):
            spec = RequestSpec(prompt_len=len(prompt), max_tokens=32, end_ids=end_ids)
            tokens, origins, _ = reference_generate(forwards, build_policy(runtime.config), "slm", prompt, spec,
                                                    max_model_len=runtime.max_model_len)
            assert result.token_ids == tokens
            assert result.models == [runtime.config.model_names[o] for o in origins]
        assert 0.1 < sum(r.large_model_share for r in results) / len(results) < 0.6
