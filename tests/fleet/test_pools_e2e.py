"""The pair split over Dynamo workers, end to end: `tokenrouter fleet --tiny --pools 1+2` on loopback
(the entry worker: small model and policy, served; two peer workers of the large model, each request
pinned to one), called through Dynamo's OpenAI frontend. Each worker's own numbers come from its stats
endpoint (helpers/pools.py). Several entry workers: test_entry_pool_e2e.py.

One deployment for the whole file; the last tests kill a peer worker and stop the deployment, so the
file runs in order."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import openai
import pytest

from helpers.pools import (Pools, completion, concurrent_completions_equal_the_embedded_api, idle, pools_fixture,
                           reference_fixture, TokenStream)
from helpers.streams import streaming
from tokenrouter import TokenRouter

pytestmark = pytest.mark.timeout(400)
PROMPT_IDS = [321, 784, 10, 67, 14, 301, 309]
PROMPTS = [PROMPT_IDS, [5, 6, 7, 8], [1000, 2000, 30, 40, 50, 60], [77] * 9]
KILLED_RUN_TOKENS = 600  # long enough to be still running when its peer worker is killed


pools = pools_fixture("1+2")
reference = reference_fixture()


def concurrent_spread(pools: Pools, reference: TokenRouter, instances: list[int] | None = None) -> list[int]:
    """Four requests at once, each equal to the oracle; the large-model tokens each instance computed
    meanwhile (all of them credited to the large model in the responses)."""
    before = pools.stats.tokens("llm", instances)
    models = concurrent_completions_equal_the_embedded_api(pools, reference, PROMPTS)
    grew = [b - a for a, b in zip(before, pools.stats.tokens("llm", instances))]
    assert sum(grew) == sum(m.count("llm") for m in models)
    return grew


def test_each_peer_instance_is_linked_under_the_id_it_reports(pools):
    """The entry pins requests by the instance ids its client sees; a worker names itself (as the
    origin of its calls) by its connection id: the two must be the same number."""
    ids = pools.stats.ids("llm")
    assert len(ids) == 2 and [stats["instance"] for stats in pools.stats.of("llm")] == ids
    assert pools.stats.of("slm")[0]["linked"]["llm"] == [str(i) for i in ids]


def test_greedy_tokens_equal_the_embedded_api_and_the_large_model_ran_in_a_peer_worker(pools, reference):
    before = pools.stats.tokens("llm")
    tokens, models, response = completion(pools, PROMPT_IDS, 24)
    expected = reference.generate([PROMPT_IDS], max_tokens=24, ignore_eos=True)[0]
    assert tokens == expected.token_ids
    assert models == expected.models
    assert response.choices[0].finish_reason == "length" and response.usage.completion_tokens == 24
    grew = [b - a for a, b in zip(before, pools.stats.tokens("llm"))]
    # The handoffs crossed workers, all to one instance (the request was pinned there): it computed
    # exactly the tokens credited to the large model.
    assert models.count("llm") > 0
    assert sorted(grew) == [0, models.count("llm")], grew


def test_concurrent_requests_each_equal_the_embedded_api_and_spread_over_the_pool(pools, reference):
    grew = concurrent_spread(pools, reference)
    assert all(g > 0 for g in grew), grew  # placement used both instances


def test_kv_is_back_to_zero_on_both_workers_after_finish(pools):
    completion(pools, PROMPT_IDS, 30)
    stats = pools.idle()
    assert all(idle(s) for s in stats), stats


def test_a_disconnect_frees_kv_on_both_workers(pools):
    with streaming(pools.url, PROMPT_IDS, 900):  # 20 tokens: the random policy (rate 0.3) used both models
        entry, peers = pools.stats.of("slm")[0], pools.stats.of("llm")
    assert entry["kv_blocks_used"] > 0 and sorted(p["kv_blocks_used"] > 0 for p in peers) == [False, True], peers
    stats = pools.idle(timeout=2.0)
    assert all(idle(s) for s in stats), stats


def test_bad_input_gets_an_openai_error_naming_the_field(pools):
    with pytest.raises(openai.BadRequestError, match="min_p"):
        pools.client.completions.create(model="tokenrouter", prompt=PROMPT_IDS, max_tokens=4,
                                        extra_body={"min_p": 0.5})
    assert pools.client.completions.create(model="tokenrouter", prompt=PROMPT_IDS, max_tokens=2).choices


def test_a_killed_peer_worker_does_not_fail_its_request_it_goes_on_at_the_other_instance(pools, reference):
    """The entry holds every token of a request: when the large-model worker it is pinned to is killed
    mid-run, the request goes on at the other instance (its whole context prefilled there, as a first
    visit) and ends with exactly the embedded API's greedy tokens; then KV is back to zero on the entry
    and on the instance left, and nothing is pinned."""
    stream = TokenStream(pools, PROMPT_IDS, KILLED_RUN_TOKENS)
    stream.until(20)  # 20 tokens: the random policy (rate 0.3) has handed the request to its instance
    pinned = pools.stats.of("slm")[0]["pinned"]["llm"]
    victim = next(int(instance) for instance, count in pinned.items() if count == 1)
    survivor = next(instance for instance in pools.stats.ids("llm") if instance != victim)
    before = pools.stats.tokens("llm", [survivor])[0]
    os.kill(pools.stats.pid("llm", victim), signal.SIGKILL)
    stream.rest()
    expected = reference.generate([PROMPT_IDS], max_tokens=KILLED_RUN_TOKENS, ignore_eos=True)[0]
    assert stream.finish == "length" and stream.tokens == expected.token_ids
    assert pools.stats.tokens("llm", [survivor])[0] > before  # it went on there (nothing else ran)
    stats = pools.idle(timeout=5.0, peers=[survivor])
    assert all(idle(s) for s in stats), stats


def test_the_restarted_peer_worker_is_linked_and_takes_new_requests(pools, reference):
    """The launcher starts the killed worker again; the entry links the new instance by itself and
    places new requests on it as on the one left. (The killed one stays in file discovery: only the
    linked instances are asked for their stats.)"""
    deadline = time.monotonic() + 120
    while len(linked := pools.stats.of("slm")[0]["linked"]["llm"]) < 2:
        assert time.monotonic() < deadline, f"the restarted peer worker was not linked; logs in {pools.run_dir}"
        time.sleep(0.5)
    grew = concurrent_spread(pools, reference, [int(i) for i in linked])
    assert all(g > 0 for g in grew), grew


def test_sigterm_stops_every_worker(pools):
    workers = [*pools.worker_pids("entry_engine"), *pools.worker_pids("peer_worker")]
    pools.stats.close()
    pools.stats = None
    pools.process.send_signal(signal.SIGTERM)
    assert pools.process.wait(90) == 0
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers)
