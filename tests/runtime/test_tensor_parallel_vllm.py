"""The large model at tensor-parallel size 2 on vLLM's CPU backend (two worker processes, one core
per rank), next to the session's one-rank engines (tests/conftest.py):

- the TP-2 engine's tokens equal the one-rank engine's, and its logits and hidden states agree,
  step for step through prefills, decodes, a pending request and extends with foreign tokens, in
  steps that ask for the full logits and in steps that ask rank 0 for tokens, top-k and hidden states only;
- a resume computes only the new tokens (vLLM's own counters), and the pending request keeps its blocks;
- routed greedy output with the large model at TP 2 equals the naive full-recompute reference (the
  oracle that holds the one-rank engines too, tests/runtime/test_oracle_vllm.py), KV back to zero,
  with a policy that reads the logits (r_stitch) and one that reads none (random: its steps fetch no logits);
- a rank killed mid-generation ends that model's requests at once with an error that says so (its other
  rank is killed, not waited for), and the small model's pool goes back to zero.

One TP-2 engine for the module (about a minute to start here); the rank test kills it, so it runs last.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from helpers.oracle import run_and_compare

from tokenrouter.config import load_config
from tokenrouter.engine.base import StepRow
from tokenrouter.procfs import child_pids, proc_stat
from tokenrouter.runtime.api import TokenRouter


# Below vLLM's own 5 s wait for the ranks to exit: what it took before the rank watch (rank_watch.py).
KILLED_RANK_ENDS_REQUESTS_S = 4.0


@pytest.fixture(scope="module")
def tp_large(tiny_pair):
    from tokenrouter.config import ModelSpec
    from tokenrouter.engine.factory import create_engine

    spec = ModelSpec(path=str(tiny_pair["large"]), engine="vllm", dtype="float32", kv_cache_tokens=8192,
                     tensor_parallel_size=2)
    engine = create_engine("large", spec)
    yield engine
    engine.close()


@pytest.fixture
def engines(vllm_tiny_engines, tp_large):
    """The routed pair: the session's one-rank small model, the large model at TP 2."""
    yield {"small": vllm_tiny_engines["small"], "large": tp_large}
    for engine in (vllm_tiny_engines["small"], vllm_tiny_engines["large"], tp_large):
        assert engine.sequence_ids() == [] and engine.num_free_blocks == engine.num_total_blocks


def test_the_engine_runs_two_ranks(tp_large):
    settings = tp_large.call("runner_settings")
    assert settings["tensor_parallel_size"] == 2 and settings["input_batch"]
    assert len(_worker_pids(tp_large)) == 2


def test_tp2_steps_equal_one_rank(engines, vllm_tiny_engines):
    """Prefills of mixed lengths, decodes, c away for three steps, then c extended with foreign tokens:
    the same rows on both engines give the same tokens; logits and hidden states agree."""
    one, two = vllm_tiny_engines["large"], engines["large"]
    prompts = {"a": [5], "b": list(range(40, 47)), "c": list(range(100, 133))}
    last: dict[str, int] = {}
    plan = [dict(prompts), dict.fromkeys("abc")] + [dict.fromkeys("ab")] * 3 + [{"a": None, "c": [7, 2020, 303]},
                                                                                 dict.fromkeys("abc")]
    try:
        for engine in (one, two):
            for seq_id in prompts:
                engine.add_sequence(seq_id)
        for i, feeds in enumerate(plan):
            rows = [StepRow(seq_id, [last[seq_id]] if new is None else new) for seq_id, new in feeds.items()]
            # Every other step the TP-2 engine is not asked for the logits: rank 0 sends back tokens,
            # top-k and hidden states only, and they must be the same.
            reduced = i % 2 == 1
            results = [one.step(rows, return_hidden=True, top_logits=5),
                       two.step(rows, return_hidden=True, top_logits=5, return_logits=not reduced)]
            assert results[0].sampled.tolist() == results[1].sampled.tolist()
            if reduced:
                assert results[1].logits is None
                torch.testing.assert_close(results[1].topk_values, results[0].topk_values, atol=1e-3, rtol=1e-4)
            else:
                torch.testing.assert_close(results[1].logits, results[0].logits, atol=1e-3, rtol=1e-4)
            torch.testing.assert_close(results[1].hidden, results[0].hidden, atol=1e-3, rtol=1e-4)
            assert results[0].topk_indices.tolist() == results[1].topk_indices.tolist()
            last.update(zip(feeds, results[1].sampled.tolist()))
    finally:
        for engine in (one, two):
            for seq_id in prompts:
                engine.release(seq_id)


def test_pending_keeps_its_blocks_and_resume_computes_only_new_tokens(engines):
    engine = engines["large"]
    engine.add_sequence("away")
    engine.step([StepRow("away", list(range(3, 83)))])
    blocks = engine.call("block_ids", "away")
    for wave in range(2):
        ids = [f"busy{wave}-{i}" for i in range(3)]
        for seq_id in ids:
            engine.add_sequence(seq_id)
        engine.step([StepRow(seq_id, list(range(100, 140))) for seq_id in ids])
        for token in range(3):
            engine.step([StepRow(seq_id, [token + 7]) for seq_id in ids])
        for seq_id in ids:
            assert set(engine.call("block_ids", seq_id)).isdisjoint(blocks), "a pending request's block was reused"
            engine.release(seq_id)
    assert engine.call("block_ids", "away") == blocks and engine.call("computed_tokens", "away") == 80
    for k in (1, 4):
        before = engine.num_cached("away")
        engine.step([StepRow("away", [9] * k)])
        assert engine.call("last_step_tokens") == {"away": k}, "resume recomputed more than its new tokens"
        assert engine.call("computed_tokens", "away") == before + k
    engine.release("away")


@pytest.mark.parametrize("name,params", [("r_stitch", {"threshold": 0.35}), ("random", {"rate": 0.3, "seed": 7})])
def test_routed_greedy_equals_the_reference(name, params, tiny_config, mixed_prompts, references, engines):
    config = tiny_config(name, params, slm_b=1, llm_b=[1, 2])
    results = run_and_compare(config, engines, references, mixed_prompts(10, seed=3))
    assert any(0 < result.large_model_share < 1 for result in results), "no request was routed"


def test_a_killed_rank_ends_the_models_requests_with_an_error(tiny_config, mixed_prompts, vllm_tiny_engines,
                                                              tp_large):
    """Last: it kills a rank of the module's TP-2 engine."""
    config = tiny_config("llm_only", {})
    for spec in config["models"].values():
        spec.update(engine="vllm", block_size=32)
    small = vllm_tiny_engines["small"]
    with TokenRouter(load_config(config), engines={"slm": small, "llm": tp_large}) as router:
        handles = [router.submit(prompt, max_tokens=400) for prompt in mixed_prompts(4, seed=9)]
        deadline = time.monotonic() + 120
        while not all(len(handle.token_ids) >= 3 for handle in handles) and time.monotonic() < deadline:
            time.sleep(0.05)
        killed_at = time.monotonic()
        os.kill(_worker_pids(tp_large)[-1], signal.SIGKILL)
        results = [handle.wait(60) for handle in handles]
        # At once: the other rank, stuck in a collective with the dead one, is killed rather than waited
        # for (vLLM alone waits 5 s for it to exit, then 4 s after a SIGTERM it cannot act on).
        ended_s = time.monotonic() - killed_at
        assert ended_s < KILLED_RANK_ENDS_REQUESTS_S, ended_s
        assert _worker_pids(tp_large) == []  # vLLM reaps every rank before it fails the step
        for result in results:
            assert result.finish_reason == "error", result
            assert "tensor-parallel ranks died" in result.error, result.error
            assert len(result.token_ids) < 400
        # The subserver goes down (under Triton its stub then exits and the supervisor restarts the server):
        # the failed batch answers its requests first, then the loop fails the rest and sets ``died``.
        assert router.subservers["llm"].died.wait(30) and not router.subservers["llm"].alive
    assert small.sequence_ids() == [] and small.num_free_blocks == small.num_total_blocks


def _worker_pids(engine) -> list[int]:
    """vLLM's worker processes (one per rank) under the engine's process."""
    stats = {pid: proc_stat(pid) for pid in child_pids(engine.pid)}
    return sorted(pid for pid, stat in stats.items() if stat is not None and stat.comm.startswith("VLLM::Worker"))
