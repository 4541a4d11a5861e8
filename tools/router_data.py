"""Router training data: a local code corpus, teacher-forced through both models, labelled per position.

Each model reads the same token chunks (teacher forcing: the context is the corpus text, never a
model's own output). At every position t the small model gives the signals a router sees at run
time (last hidden state, top-k logits, its greedy token) and both models give their top-1 token
and the log-probability of the corpus's true next token. Models run one after the other, so only
one is in memory at a time.
"""

from __future__ import annotations

import random
import sysconfig
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm

MIN_CHUNK_TOKENS = 32  # shorter files teach little and mostly pad a batch
LOGIT_ROWS = 256  # positions per lm_head call: bounds the [rows, vocab] float32 block in memory


def stdlib_dir() -> Path:
    """The running Python's standard library: real code on every machine."""
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(root: Path, max_files: int | None = None) -> list[Path]:
    """Sorted ``.py`` files under ``root`` (no site-packages, no caches); ``max_files`` evenly spaced
    over the sorted list, so a small sample still spans the whole library."""
    files = sorted((p for p in root.rglob("*.py") if p.is_file()
                    and not {"site-packages", "__pycache__"} & set(p.relative_to(root).parts)),
                   key=lambda p: p.relative_to(root).as_posix())
    if max_files is not None and 0 < max_files < len(files):
        step = len(files) / max_files
        files = [files[int(i * step)] for i in range(max_files)]
    return files


@dataclass
class Corpus:
    chunks: list[list[int]]
    files: int  # files that gave at least one chunk

    @property
    def positions(self) -> int:
        """Labelled positions: every token that has a next token in its chunk."""
        return sum(len(c) - 1 for c in self.chunks)


def make_corpus(encode: Callable[[str], list[int]], files: list[Path], *, seq_len: int, max_tokens: int,
                chunks_per_file: int, seed: int) -> Corpus:
    """Up to ``chunks_per_file`` windows of ``seq_len`` tokens per file, at seeded offsets, until
    ``max_tokens`` tokens are collected. Files are visited in a seeded order, so a budget that ends
    early still samples the whole list rather than its alphabetical start."""
    rng = random.Random(seed)
    chunks: list[list[int]] = []
    used, total = 0, 0
    for path in rng.sample(files, len(files)):
        if total >= max_tokens:
            break
        ids = encode(path.read_text(encoding="utf-8", errors="replace"))
        windows = [ids[i:i + seq_len] for i in range(0, len(ids), seq_len)]
        windows = [w for w in windows if len(w) >= MIN_CHUNK_TOKENS]
        picked = sorted(rng.sample(range(len(windows)), min(chunks_per_file, len(windows))))
        for index in picked:
            chunk = windows[index][:max(MIN_CHUNK_TOKENS, max_tokens - total)]
            chunks.append(chunk)
            total += len(chunk)
        used += bool(picked)
    return Corpus(chunks, used)


def _batches(chunks: list[list[int]], batch_size: int, pad_id: int):
    for start in range(0, len(chunks), batch_size):
        batch = chunks[start:start + batch_size]
        width = max(len(c) for c in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, chunk in enumerate(batch):
            ids[row, :len(chunk)] = torch.tensor(chunk)
            mask[row, :len(chunk)] = 1
        yield batch, ids, mask


@torch.inference_mode()
def teacher_force(model: torch.nn.Module, chunks: list[list[int]], *, batch_size: int, pad_id: int,
                  top_k: int = 0, keep_hidden: bool = False, desc: str = "teacher forcing") -> dict[str, torch.Tensor]:
    """Per position (chunk order, then position order): ``top1``, ``logp_next`` (log-probability of
    the true next token) and, when asked, ``hidden`` [N, H] (final, post-norm, as the engine
    reports it) and ``topk`` [N, k] (raw logits, descending)."""
    decoder, lm_head = model.get_decoder(), model.get_output_embeddings()
    parts: dict[str, list[torch.Tensor]] = defaultdict(list)
    with tqdm(total=sum(len(c) for c in chunks), desc=desc, unit="tok", dynamic_ncols=True) as bar:
        for batch, ids, mask in _batches(chunks, batch_size, pad_id):
            hidden = decoder(input_ids=ids, attention_mask=mask).last_hidden_state.float()
            for row, chunk in enumerate(batch):
                usable = hidden[row, :len(chunk) - 1]
                targets = torch.tensor(chunk[1:])
                for start in range(0, len(usable), LOGIT_ROWS):
                    h = usable[start:start + LOGIT_ROWS]
                    logits = lm_head(h).float()
                    log_probs = torch.log_softmax(logits, dim=-1)
                    parts["top1"].append(logits.argmax(dim=-1))
                    parts["logp_next"].append(log_probs.gather(1, targets[start:start + LOGIT_ROWS, None])[:, 0])
                    if top_k:
                        parts["topk"].append(torch.topk(logits, top_k, dim=-1).values)
                    if keep_hidden:
                        parts["hidden"].append(h.clone())
            bar.update(int(mask.sum()))
    return {key: torch.cat(values) for key, values in parts.items()}


def position_index(chunks: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(chunk id, position in chunk) of every labelled position, in ``teacher_force`` order."""
    chunk_ids = torch.cat([torch.full((len(c) - 1,), i, dtype=torch.long) for i, c in enumerate(chunks)])
    offsets = torch.cat([torch.arange(len(c) - 1) for c in chunks])
    return chunk_ids, offsets


@torch.inference_mode()
def confirm_divergence(model: torch.nn.Module, decode: Callable[[list[int]], str], chunks: list[list[int]],
                       candidates: torch.Tensor, small_top1: torch.Tensor, large_top1: torch.Tensor, *,
                       tokens: int, batch_size: int, pad_id: int) -> torch.Tensor:
    """Keep a disagreement only if it changes what the large model goes on to write.

    For each candidate position, the large model continues greedily for ``tokens`` tokens after the
    small model's token and after its own; the disagreement is real when the two texts differ on
    their common length (a different tokenization of the same text, e.g. " re"+"turn" against
    " return", is not). Returns a bool per candidate.
    """
    chunk_ids, offsets = position_index(chunks)
    prefixes = []
    for index in candidates.tolist():
        context = chunks[int(chunk_ids[index])][:int(offsets[index]) + 1]
        prefixes += [context + [int(small_top1[index])], context + [int(large_top1[index])]]
    texts = []
    for start in tqdm(range(0, len(prefixes), batch_size), desc="confirming divergence", unit="batch",
                      dynamic_ncols=True):
        batch = prefixes[start:start + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, prefix in enumerate(batch):  # left padding: every row continues from its last column
            ids[row, width - len(prefix):] = torch.tensor(prefix)
            mask[row, width - len(prefix):] = 1
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=tokens, min_new_tokens=tokens,
                             do_sample=False, pad_token_id=pad_id)
        for row in range(len(batch)):
            texts.append(decode([int(ids[row, -1])] + out[row, width:].tolist()))
    keep = []
    for small_text, large_text in zip(texts[0::2], texts[1::2]):
        common = min(len(small_text), len(large_text))
        keep.append(small_text[:common] != large_text[:common])
    return torch.tensor(keep, dtype=torch.bool)
