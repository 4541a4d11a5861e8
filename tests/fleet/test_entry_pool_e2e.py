"""Several entry workers, end to end: `tokenrouter fleet --tiny --pools 2+2` on loopback (two entry
workers, each the small model and the policy registered as the served model; two peer workers of the
large model), called through Dynamo's OpenAI frontend, which spreads requests over the entries. Every
peer instance serves requests of every entry instance and answers each on the instance that owns it.

One deployment for the whole file; the last test kills an entry worker, so the file runs in order."""

from __future__ import annotations

import os
import signal
from contextlib import ExitStack

import pytest

from helpers.pools import (MODELS, concurrent_completions_equal_the_embedded_api, idle, pools_fixture,
                           reference_fixture, TokenStream)
from helpers.streams import streaming

pytestmark = pytest.mark.timeout(400)
PROMPTS = [[321, 784, 10, 67, 14, 301, 309], [5, 6, 7, 8], [1000, 2000, 30, 40, 50, 60], [77] * 9,
           [12, 13, 14], [400, 401, 402, 403, 404], [9] * 5, [2024, 7, 7]]
KILLED_RUN_TOKENS = 300  # long enough to be still running when its entry worker is killed


pools = pools_fixture("2+2")
reference = reference_fixture()


def test_every_entry_links_every_peer_and_every_peer_every_entry(pools):
    entries, peers = pools.stats.ids("slm"), pools.stats.ids("llm")
    assert len(entries) == len(peers) == 2
    assert all(s["linked"]["llm"] == [str(i) for i in peers] for s in pools.stats.of("slm"))
    assert all(s["linked"]["slm"] == [str(i) for i in entries] for s in pools.stats.of("llm"))


def test_concurrent_requests_equal_the_embedded_api_over_both_entries_and_both_peers(pools, reference):
    before = {model: pools.stats.tokens(model) for model in MODELS}
    models = concurrent_completions_equal_the_embedded_api(pools, reference, PROMPTS, max_tokens=16)
    grew = {model: [b - a for a, b in zip(before[model], pools.stats.tokens(model))] for model in MODELS}
    assert all(g > 0 for g in grew["slm"] + grew["llm"]), grew  # the frontend used both entries; they both peers
    assert sum(grew["llm"]) == sum(m.count("llm") for m in models)  # each large-model token computed once
    stats = pools.idle()
    assert all(idle(s) for s in stats), stats


def test_every_peer_holds_requests_of_every_entry_and_disconnects_free_every_worker(pools):
    """Four streams (the frontend's round robin: two per entry; each entry pins its two to different
    peers): each peer holds one request of each entry, answering each on its own entry. The clients
    disconnect: KV, held requests and pins back to zero on all four workers."""
    with ExitStack() as streams:
        for prompt in PROMPTS[:4]:
            streams.enter_context(streaming(pools.url, prompt, 900))
        entries, peers = pools.stats.of("slm"), pools.stats.of("llm")
    assert [s["requests_held"] for s in entries] == [2, 2], entries
    assert all(sorted(p["pinned"]["slm"].values()) == [1, 1] for p in peers), peers
    assert all(p["kv_blocks_used"] > 0 and p["active"] == 4 for p in peers), peers  # N: both entries' counts
    stats = pools.idle()
    assert all(idle(s) for s in stats), stats


def test_a_killed_entry_worker_s_request_moves_to_the_other_entry_and_every_peer_frees_it(pools, reference):
    """SIGKILL the entry worker a streamed request runs on: Dynamo's frontend migrates the request to the
    other entry (the prompt and the tokens streamed so far, as a new request), which ends it with the
    embedded API's greedy tokens (the random policy decides by position, so the continuation is routed
    as the whole would have been). Every peer frees what it held for the lost entry; the other entry
    keeps serving."""
    stream = TokenStream(pools, PROMPTS[0], KILLED_RUN_TOKENS)
    stream.until(20)  # 20 tokens: the random policy (rate 0.3) has handed the request to a peer
    held = pools.stats.of("slm")
    victim = next(s for s in held if s["requests_held"] == 1)
    survivor = next(s["instance"] for s in held if s is not victim)
    peers = pools.stats.ids("llm")
    assert sum(p["pinned"]["slm"].get(str(victim["instance"]), 0) for p in pools.stats.of("llm")) == 1
    os.kill(victim["pid"], signal.SIGKILL)
    stream.rest()
    expected = reference.generate([PROMPTS[0]], max_tokens=KILLED_RUN_TOKENS, ignore_eos=True)[0]
    assert stream.finish == "length" and stream.tokens == expected.token_ids
    stats = pools.idle(timeout=5.0, entries=[survivor], peers=peers)
    assert all(idle(s) for s in stats), stats  # the lost entry's pin and KV at a peer are gone too
    concurrent_completions_equal_the_embedded_api(pools, reference, PROMPTS[:4], max_tokens=16)
