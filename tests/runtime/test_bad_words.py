"""Bad words: banned continuations never appear, the output equals the naive reference that applies
the same constraint, and allowed tokens are never changed by the resampling."""

from __future__ import annotations

import torch

from tokenrouter import TokenRouter
from tokenrouter.engine.base import StepResult
from tokenrouter.engine.sampling import sample_tokens
from tokenrouter.runtime.request import RequestState
from tokenrouter.runtime.constraints import banned_next_tokens, enforce_bad_words
from tokenrouter.protocol import RequestSpec
from tokenrouter.runtime.assembly import build_policy
from tokenrouter.runtime.reference import reference_generate


def test_banned_next_tokens_follow_the_context():
    bad = [[7], [1, 2, 3], [9, 9]]
    assert banned_next_tokens([4, 5], bad) == [7]
    assert banned_next_tokens([0, 1, 2], bad) == [7, 3]
    assert banned_next_tokens([9], bad) == [7, 9]


def _view(bad, temperature=0.0, seed=0):
    spec = RequestSpec(prompt_len=2, max_tokens=4, temperature=temperature, seed=seed, bad_sequences=bad)
    return RequestState(rid="r", model="slm", model_index=0, token_ids=[1, 2], prompt_len=2, origins=[], spec=spec)


def test_resampling_keeps_allowed_tokens_and_replaces_banned_ones():
    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(0))
    views = [_view([[5]], temperature=1.0, seed=s) for s in range(64)]
    params, positions = [v.sampling for v in views], [2] * 64
    free = sample_tokens(logits, params, positions)
    out = StepResult(seq_ids=list(range(64)), sampled=free.clone(), logits=logits, positions=torch.tensor(positions))
    enforce_bad_words(views, out)
    assert 5 not in out.sampled.tolist()
    kept = free != 5
    assert torch.equal(out.sampled[kept], free[kept])  # the same draw: allowed tokens never move
    assert torch.isinf(out.logits[:, 5]).all()


def test_served_output_avoids_bad_words_and_matches_reference(tiny_config, mixed_prompts, references):
    prompts = mixed_prompts(8, seed=21)
    with TokenRouter.from_config(tiny_config("random", {"rate": 0.3, "seed": 1})) as engine:
        free = engine.generate(prompts, max_tokens=16)
        common = max({t for r in free for t in r.token_ids}, key=lambda t: sum(r.token_ids.count(t) for r in free))
        word = engine.codec.decode([common])
        banned = engine.codec.token_sequences([word])
        assert banned, "the most common token must round-trip as a word"
        results = engine.generate(prompts, max_tokens=16, bad_words=[word])
        end_ids = engine.codec.end_ids(engine.engines["slm"].eos_token_ids)
        for prompt, result in zip(prompts, results):
            context = list(prompt)
            for token in result.token_ids:
                assert token not in banned_next_tokens(context, banned)
                context.append(token)
            spec = RequestSpec(prompt_len=len(prompt), max_tokens=16, end_ids=end_ids, bad_sequences=banned)
            tokens, _, _ = reference_generate(references, build_policy(engine.config), "slm", prompt, spec,
                                              max_model_len=engine.max_model_len)
            assert result.token_ids == tokens
        assert [r.token_ids for r in results] != [r.token_ids for r in free]


def test_a_position_where_every_token_is_banned_is_reported_not_sampled():
    """Catches emitting a banned token (argmax of an all -inf row) when bad words leave nothing."""
    vocab = 8
    everything = [[2, v] for v in range(vocab)]  # after token 2, every continuation is banned
    views = [_view(everything), _view([[5]])]  # both contexts end in token 2
    logits = torch.randn(2, vocab, generator=torch.Generator().manual_seed(1))
    out = StepResult(seq_ids=[0, 1], sampled=logits.argmax(-1), logits=logits, positions=torch.tensor([2, 2]))
    assert enforce_bad_words(views, out) == [0]
    assert int(out.sampled[1]) != 5


def test_the_core_ends_that_request_with_an_error_and_serves_the_rest():
    """The request whose bad words ban every next token ends with a clear error; its batch-mate
    commits its token as usual."""
    from helpers.core_driver import VOCAB, Sink, core, step

    from tokenrouter.runtime.request import Submission

    entry = core()
    sinks = {}
    for rid, bad in (("walled", [[3, v] for v in range(VOCAB)]), ("free", [])):
        sinks[rid] = Sink()
        spec = RequestSpec(prompt_len=3, max_tokens=4, end_ids=[0], bad_sequences=bad)
        entry.submit(Submission(rid, [1, 2, 3], spec, sinks[rid], submitted_at=0.0), 0.0)
    entry.tick(0.0)  # admission
    step(entry, entry.schedule(0.0), [7, 7])
    assert sinks["walled"].finish == "error" and "ban every possible next token" in sinks["walled"].error
    assert sinks["walled"].tokens == []
    assert sinks["free"].tokens == [7] and sinks["free"].finish is None
    assert "walled" not in entry.requests
