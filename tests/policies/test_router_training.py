"""Pieces of the router training tool: corpus, teacher forcing, labels, AUC, threshold, split."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tokenrouter_tools.router_data import (MIN_CHUNK_TOKENS, confirm_divergence, corpus_files, make_corpus,
                                           position_index, stdlib_dir, teacher_force)
from tokenrouter_tools.router_training import pick_threshold, roc_auc, split_by_chunk


def test_pick_threshold_is_the_highest_cut_with_the_target_recall():
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2])
    labels = torch.tensor([1, 0, 1, 0, 1, 0, 0, 1])
    choice = pick_threshold(scores, labels, 0.75)  # 3 of 4 positives: cut at 0.5
    assert choice.threshold == 0.5 and choice.recall == 0.75
    assert choice.route_rate == 5 / 8 and choice.precision == 3 / 5
    assert pick_threshold(scores, labels, 1.0).threshold == pytest.approx(0.2)
    # Ties with the cut score are routed too, so recall never drops below the target.
    tied = pick_threshold(torch.tensor([0.5, 0.5, 0.5, 0.1]), torch.tensor([1, 0, 1, 0]), 0.5)
    assert tied.threshold == 0.5 and tied.recall == 1.0 and tied.route_rate == 0.75
    with pytest.raises(ValueError, match="no positive"):
        pick_threshold(scores, torch.zeros(8), 0.9)


def test_roc_auc_matches_pair_counting():
    generator = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 20, (300,), generator=generator).float()  # many ties
    labels = torch.rand(300, generator=generator) < 0.3
    pos, neg = scores[labels], scores[~labels]
    wins = (pos[:, None] > neg[None, :]).float() + 0.5 * (pos[:, None] == neg[None, :]).float()
    assert roc_auc(scores, labels) == pytest.approx(float(wins.mean()))
    assert roc_auc(torch.tensor([0.1, 0.9]), torch.tensor([0, 1])) == 1.0
    one_class = roc_auc(torch.tensor([0.1, 0.9]), torch.tensor([1, 1]))
    assert one_class != one_class  # NaN: one class alone has no ROC curve


def test_split_keeps_whole_chunks_on_one_side():
    chunk_ids = torch.repeat_interleave(torch.arange(10), 7)
    train, val = split_by_chunk(chunk_ids, 0.3, seed=1)
    assert len(set(train.tolist()) | set(val.tolist())) == 70 and not set(train.tolist()) & set(val.tolist())
    assert not set(chunk_ids[train].tolist()) & set(chunk_ids[val].tolist())
    assert len(set(chunk_ids[val].tolist())) == 3
    assert torch.equal(split_by_chunk(chunk_ids, 0.3, seed=1)[1], val)
    assert not torch.equal(split_by_chunk(chunk_ids, 0.3, seed=2)[1], val)


def test_corpus_files_are_sorted_real_code_without_site_packages():
    files = corpus_files(stdlib_dir())
    assert len(files) > 500 and all(f.suffix == ".py" for f in files)
    assert not any("site-packages" in f.parts or "__pycache__" in f.parts for f in files)
    sample = corpus_files(stdlib_dir(), max_files=20)
    assert len(sample) == 20 and sample[0] == files[0] and sample == sorted(sample, key=files.index)
    assert len({f.parent for f in sample}) > 3  # evenly spaced: not just the first directory


def test_make_corpus_budget_lengths_and_determinism():
    files = corpus_files(stdlib_dir(), max_files=40)
    def encode(text: str) -> list[int]:  # bytes as tokens: no tokenizer needed here
        return list(text.encode())

    corpus = make_corpus(encode, files, seq_len=100, max_tokens=1500, chunks_per_file=2, seed=0)
    assert 1500 <= sum(len(c) for c in corpus.chunks) < 1500 + 100
    assert all(MIN_CHUNK_TOKENS <= len(c) <= 100 for c in corpus.chunks)
    assert corpus.positions == sum(len(c) - 1 for c in corpus.chunks)
    again = make_corpus(encode, files, seq_len=100, max_tokens=1500, chunks_per_file=2, seed=0)
    other = make_corpus(encode, files, seq_len=100, max_tokens=1500, chunks_per_file=2, seed=1)
    assert again.chunks == corpus.chunks and other.chunks != corpus.chunks


def test_teacher_forcing_in_padded_batches_equals_one_sequence_at_a_time(tiny_pair):
    model = AutoModelForCausalLM.from_pretrained(tiny_pair["small"], dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_pair["small"])
    text = (stdlib_dir() / "textwrap.py").read_text()
    ids = tokenizer.encode(text)
    chunks = [ids[:40], ids[40:100], ids[100:133]]  # unequal lengths: right padding in one batch
    got = teacher_force(model, chunks, batch_size=3, pad_id=0, top_k=5, keep_hidden=True)
    chunk_ids, offsets = position_index(chunks)
    assert len(got["top1"]) == len(chunk_ids) == 39 + 59 + 32
    with torch.no_grad():
        for c, chunk in enumerate(chunks):
            out = model(torch.tensor([chunk]), output_hidden_states=True)
            logits, hidden = out.logits[0, :-1], out.hidden_states[-1][0, :-1]
            rows = chunk_ids == c
            assert torch.equal(got["top1"][rows], logits.argmax(-1))
            assert torch.allclose(got["hidden"][rows], hidden, atol=1e-4)
            assert torch.allclose(got["topk"][rows], logits.topk(5).values, atol=1e-4)
            truth = torch.log_softmax(logits, -1).gather(1, torch.tensor(chunk[1:])[:, None])[:, 0]
            assert torch.allclose(got["logp_next"][rows], truth, atol=1e-4)


def test_confirm_divergence_drops_agreements_and_keeps_real_differences(tiny_pair):
    model = AutoModelForCausalLM.from_pretrained(tiny_pair["large"], dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_pair["large"])
    chunks = [tokenizer.encode("def add(a, b):\n    return a + b\n")]
    n = len(chunks[0]) - 1
    small = torch.tensor(tokenizer.encode(" x" * n)[:n])
    large = small.clone()
    large[1::2] = torch.tensor(tokenizer.encode(" while"))[0]  # a different word at odd positions
    keep = confirm_divergence(model, tokenizer.decode, chunks, torch.arange(n), small, large, tokens=3,
                              batch_size=8, pad_id=0)
    assert keep.tolist() == [bool(i % 2) for i in range(n)]
