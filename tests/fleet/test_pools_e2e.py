"""The pair split over Dynamo workers, end to end: `tokenrouter fleet --tiny --pools 2+2` on loopback
(two entry workers: each the small model and the policy, registered as the served model, so the
frontend spreads requests over them; two peer workers of the large model, each request pinned to one,
which answers it on the entry that owns it), called through Dynamo's OpenAI frontend. Each worker's own
numbers come from its stats endpoint (helpers/pools.py).

One deployment for the whole file (its start is the file's main cost); the last tests kill a peer
worker, then an entry worker, and stop the deployment, so the file runs in order. A killed worker
stays in file discovery: after a kill, only the instances linked are asked for their stats."""

from __future__ import annotations

import os
import signal
import time
from contextlib import ExitStack
from pathlib import Path

import openai
import pytest

from helpers.pools import (MODELS, Pools, TokenStream, completion, concurrent_completions_equal_the_embedded_api,
                           idle, pools_fixture, reference_fixture)
from helpers.streams import streaming
from tokenrouter import TokenRouter

pytestmark = pytest.mark.timeout(400)
PROMPTS = [[321, 784, 10, 67, 14, 301, 309], [5, 6, 7, 8], [1000, 2000, 30, 40, 50, 60], [77] * 9,
           [12, 13, 14], [400, 401, 402, 403, 404], [9] * 5, [2024, 7, 7]]
KILLED_RUN_TOKENS = 300  # long enough to be still running when a worker is killed under it

pools = pools_fixture("2+2")
reference = reference_fixture()


def concurrent_spread(pools: Pools, reference: TokenRouter, prompts: list[list[int]],
                      instances: dict[str, list[int] | None]) -> dict[str, list[int]]:
    """``prompts`` at once, each equal to the oracle; the tokens each of ``instances`` (model -> ids,
    None: every registered one) computed meanwhile. The peers' are all credited to the large model in
    the responses: each large-model token was computed once, by the instance its request was pinned to."""
    before = {model: pools.stats.tokens(model, instances[model]) for model in MODELS}
    models = concurrent_completions_equal_the_embedded_api(pools, reference, prompts, max_tokens=16)
    grew = {model: [b - a for a, b in zip(before[model], pools.stats.tokens(model, instances[model]))]
            for model in MODELS}
    assert sum(grew["llm"]) == sum(m.count("llm") for m in models)
    return grew


def holding(pools: Pools) -> dict:
    """The stats of the one entry that holds a request now."""
    (entry,) = [s for s in pools.stats.of("slm") if s["requests_held"] == 1]
    return entry


def test_every_worker_links_every_instance_of_the_other_model_under_the_id_it_reports(pools):
    """An entry pins requests to the peer instance ids its client sees, a peer to the origin an entry's
    calls carry (its connection id): each must be the id the instance reports."""
    entries, peers = pools.stats.ids("slm"), pools.stats.ids("llm")
    assert len(entries) == len(peers) == 2
    assert [s["instance"] for s in pools.stats.of("slm")] == entries
    assert [s["instance"] for s in pools.stats.of("llm")] == peers
    assert all(s["linked"]["llm"] == [str(i) for i in peers] for s in pools.stats.of("slm"))
    assert all(s["linked"]["slm"] == [str(i) for i in entries] for s in pools.stats.of("llm"))


def test_greedy_tokens_equal_the_embedded_api_and_the_large_model_ran_in_one_peer_worker(pools, reference):
    before = pools.stats.tokens("llm")
    tokens, models, response = completion(pools, PROMPTS[0], 24)
    expected = reference.generate([PROMPTS[0]], max_tokens=24, ignore_eos=True)[0]
    assert tokens == expected.token_ids
    assert models == expected.models
    assert response.choices[0].finish_reason == "length" and response.usage.completion_tokens == 24
    grew = [b - a for a, b in zip(before, pools.stats.tokens("llm"))]
    # The handoffs crossed workers, all to one instance (the request was pinned there): it computed
    # exactly the tokens credited to the large model.
    assert models.count("llm") > 0
    assert sorted(grew) == [0, models.count("llm")], grew


def test_concurrent_requests_equal_the_embedded_api_over_both_entries_and_both_peers(pools, reference):
    grew = concurrent_spread(pools, reference, PROMPTS, {"slm": None, "llm": None})
    assert all(g > 0 for g in grew["slm"] + grew["llm"]), grew  # the frontend used both entries, they both peers
    stats = pools.idle()
    assert all(idle(s) for s in stats), stats  # KV, held requests and pins back to zero after finish


def test_every_peer_holds_requests_of_every_entry_and_disconnects_free_every_worker(pools):
    """Four streams (the frontend's round robin: two per entry; each entry pins its two to different
    peers): each peer holds one request of each entry, and reads N as both entries' counts. The clients
    disconnect: KV, held requests and pins back to zero on all four workers."""
    with ExitStack() as streams:
        for prompt in PROMPTS[:4]:
            streams.enter_context(streaming(pools.url, prompt, 900))
        entries, peers = pools.stats.of("slm"), pools.stats.of("llm")
    assert [s["requests_held"] for s in entries] == [2, 2], entries
    assert all(sorted(p["pinned"]["slm"].values()) == [1, 1] for p in peers), peers
    assert all(p["kv_blocks_used"] > 0 and p["active"] == 4 for p in peers), peers
    stats = pools.idle()
    assert all(idle(s) for s in stats), stats


def test_bad_input_gets_an_openai_error_naming_the_field(pools):
    with pytest.raises(openai.BadRequestError, match="min_p"):
        pools.client.completions.create(model="tokenrouter", prompt=PROMPTS[0], max_tokens=4,
                                        extra_body={"min_p": 0.5})
    assert pools.client.completions.create(model="tokenrouter", prompt=PROMPTS[0], max_tokens=2).choices


def test_a_killed_peer_worker_does_not_fail_its_request_it_goes_on_at_the_other_instance(pools, reference):
    """The entry holds every token of a request: when the large-model worker it is pinned to is killed
    mid-run, the request goes on at the other instance (its whole context prefilled there, as a first
    visit) and ends with exactly the embedded API's greedy tokens; then KV is back to zero on the entries
    and on the instance left, and nothing is pinned."""
    stream = TokenStream(pools, PROMPTS[0], KILLED_RUN_TOKENS)
    stream.until(20)  # 20 tokens: the random policy (rate 0.3) has handed the request to its instance
    pinned = holding(pools)["pinned"]["llm"]
    victim = next(int(instance) for instance, count in pinned.items() if count == 1)
    survivor = next(instance for instance in pools.stats.ids("llm") if instance != victim)
    before = pools.stats.tokens("llm", [survivor])[0]
    os.kill(pools.stats.pid("llm", victim), signal.SIGKILL)
    stream.rest()
    expected = reference.generate([PROMPTS[0]], max_tokens=KILLED_RUN_TOKENS, ignore_eos=True)[0]
    assert stream.finish == "length" and stream.tokens == expected.token_ids
    assert pools.stats.tokens("llm", [survivor])[0] > before  # it went on there (nothing else ran)
    stats = pools.idle(timeout=5.0, peers=[survivor])
    assert all(idle(s) for s in stats), stats


def test_the_restarted_peer_worker_is_linked_and_takes_new_requests(pools, reference):
    """The launcher starts the killed worker again; every entry links the new instance by itself and
    places new requests on it as on the one left."""
    deadline = time.monotonic() + 120
    while any(len(s["linked"]["llm"]) < 2 for s in pools.stats.of("slm")):
        assert time.monotonic() < deadline, f"the restarted peer worker was not linked; logs in {pools.run_dir}"
        time.sleep(0.5)
    linked = [int(i) for i in pools.stats.of("slm")[0]["linked"]["llm"]]
    grew = concurrent_spread(pools, reference, PROMPTS[:4], {"slm": None, "llm": linked})
    assert all(g > 0 for g in grew["llm"]), grew


def test_a_killed_entry_worker_s_request_moves_to_the_other_entry_and_every_peer_frees_it(pools, reference):
    """SIGKILL the entry worker a streamed request runs on: Dynamo's frontend migrates the request to the
    other entry (the prompt and the tokens streamed so far, as a new request), which ends it with the
    embedded API's greedy tokens (the random policy decides by position, so the continuation is routed
    as the whole would have been). Every peer frees what it held for the lost entry; the other entry
    keeps serving; the restarted entry worker is linked again."""
    stream = TokenStream(pools, PROMPTS[0], KILLED_RUN_TOKENS)
    stream.until(20)  # 20 tokens: the random policy (rate 0.3) has handed the request to a peer
    victim = holding(pools)
    survivor = next(s["instance"] for s in pools.stats.of("slm") if s["instance"] != victim["instance"])
    peers = [int(i) for i in victim["linked"]["llm"]]
    assert sum(p["pinned"]["slm"].get(str(victim["instance"]), 0) for p in pools.stats.of("llm", peers)) == 1
    before = pools.stats.tokens("slm", [survivor])[0]
    os.kill(victim["pid"], signal.SIGKILL)
    stream.rest()
    expected = reference.generate([PROMPTS[0]], max_tokens=KILLED_RUN_TOKENS, ignore_eos=True)[0]
    assert stream.finish == "length" and stream.tokens == expected.token_ids
    assert pools.stats.tokens("slm", [survivor])[0] > before  # it went on there (nothing else ran)
    stats = pools.idle(timeout=5.0, entries=[survivor], peers=peers)
    assert all(idle(s) for s in stats), stats  # the lost entry's pin and KV at each peer are gone too
    concurrent_completions_equal_the_embedded_api(pools, reference, PROMPTS[4:], max_tokens=16)
    # The launcher starts the entry worker again; both peers link the new instance by themselves.
    deadline = time.monotonic() + 120
    while any(len(p["linked"]["slm"]) < 2 for p in pools.stats.of("llm", peers)):
        assert time.monotonic() < deadline, f"the restarted entry worker was not linked; logs in {pools.run_dir}"
        time.sleep(0.5)


def test_sigterm_stops_every_worker(pools):
    workers = [*pools.worker_pids("entry_engine"), *pools.worker_pids("peer_worker")]
    pools.stats.close()
    pools.stats = None
    pools.process.send_signal(signal.SIGTERM)
    assert pools.process.wait(90) == 0
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers)
