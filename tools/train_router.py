"""`tokenrouter train-router`: train the R2R, CITER and Co-LLM routers for a small/large model pair.

1. Corpus: sorted ``.py`` files of the running Python's standard library (or ``--corpus``), cut into
   token chunks.
2. Features: both models teacher-forced over the chunks (transformers, batched, one model in
   memory at a time).
3. Labels per position: R2R and CITER learn "divergent" = small top-1 != large top-1 (optionally
   confirmed by the large model's continuations, ``--confirm-tokens``); Co-LLM learns its
   pseudo-label "the large model gives the true next token a higher probability".
4. Train each head on CPU (seeded split by chunk, seeded init and batch order), keep the epoch with
   the best validation AUC, pick the threshold for ``--target-recall`` on validation.
5. Write ``<out>/<algo>/model.safetensors`` + ``metadata.json``; point ``policy.weights`` there.

The same arguments and seed on the same machine give the same files.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tokenrouter.launch.paths import routers_dir
from tokenrouter.policies.networks import build_network, count_parameters, save_router
from tokenrouter_engines.models import default_dest as models_dir

from .router_data import confirm_divergence, corpus_files, make_corpus, position_index, stdlib_dir, teacher_force
from .router_training import pick_threshold, split_by_chunk, train_network

DEFAULT_SMALL = models_dir() / "qwen2.5-coder-0.5b-instruct"
DEFAULT_LARGE = models_dir() / "qwen2.5-coder-1.5b-instruct"
DEFAULT_OUT = routers_dir()
ALGORITHMS = ("r2r", "citer", "co_llm")
LABELS = {
    "r2r": "small top-1 != large top-1 (teacher forced)",
    "citer": "small top-1 != large top-1 (teacher forced)",
    "co_llm": "large log p(true next) > small log p(true next)",
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--algo", nargs="+", choices=ALGORITHMS, default=list(ALGORITHMS),
                        help="routers to train (default: all; one feature collection serves them all)")
    parser.add_argument("--small", type=Path, default=DEFAULT_SMALL, help="small model HF directory (the entry)")
    parser.add_argument("--large", type=Path, default=DEFAULT_LARGE, help="large model HF directory")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="each router goes to OUT/<algo>/ (default: model_repository/routing_policy/1/, the "
                             "routing_policy model's version folder)")
    data = parser.add_argument_group("data")
    data.add_argument("--corpus", type=Path, default=None, help="directory of .py files (default: the stdlib)")
    data.add_argument("--max-files", type=int, default=400, help="files, evenly spaced over the sorted list")
    data.add_argument("--max-tokens", type=int, default=20_000, help="total corpus tokens to teacher-force")
    data.add_argument("--seq-len", type=int, default=256, help="tokens per chunk")
    data.add_argument("--chunks-per-file", type=int, default=1)
    data.add_argument("--batch-size", type=int, default=4, help="chunks per forward pass")
    data.add_argument("--confirm-tokens", type=int, default=0,
                      help="confirm each disagreement by N greedy large-model tokens after either choice (0: off)")
    data.add_argument("--cache", type=Path, default=None, help="save/reuse collected features in this file")
    net = parser.add_argument_group("networks")
    net.add_argument("--top-k", type=int, default=100, help="R2R: top-k logits fed to the router")
    net.add_argument("--d-model", type=int, default=256, help="R2R: width of the residual blocks")
    net.add_argument("--blocks", type=int, default=2, help="R2R: residual blocks")
    net.add_argument("--expansion", type=int, default=4, help="R2R: MLP expansion in each block")
    net.add_argument("--head-width", type=int, default=256, help="CITER/Co-LLM: hidden width")
    net.add_argument("--head-depth", type=int, default=2, help="CITER/Co-LLM: hidden layers")
    train = parser.add_argument_group("training")
    train.add_argument("--epochs", type=int, default=10)
    train.add_argument("--lr", type=float, default=1e-3)
    train.add_argument("--weight-decay", type=float, default=0.01)
    train.add_argument("--train-batch", type=int, default=256)
    train.add_argument("--val-fraction", type=float, default=0.2, help="share of chunks held out")
    train.add_argument("--target-recall", type=float, default=0.95,
                       help="threshold: lowest routing rate with this recall")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")


def _check_model_dir(path: Path) -> None:
    if not (path / "config.json").is_file():
        raise SystemExit(f"train-router: {path} is not a model directory (no config.json); "
                         "install the pair with `tokenrouter models` or pass --small/--large")


def _load_model(path: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def collect(args: argparse.Namespace, chunks: list[list[int]], tokenizer: Any) -> dict[str, torch.Tensor]:
    """Teacher-forced features of both models, plus the small model's frozen input embeddings."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    small = _load_model(args.small)
    features = {f"small_{k}": v for k, v in teacher_force(
        small, chunks, batch_size=args.batch_size, pad_id=pad, top_k=args.top_k, keep_hidden=True,
        desc=f"small {args.small.name}").items()}
    features["embedding"] = small.get_input_embeddings().weight.detach().to(torch.float16).clone()
    del small
    large = _load_model(args.large)
    features.update({f"large_{k}": v for k, v in teacher_force(
        large, chunks, batch_size=args.batch_size, pad_id=pad, desc=f"large {args.large.name}").items()})
    disagree = features["small_top1"] != features["large_top1"]
    features["divergent"] = disagree
    if args.confirm_tokens:
        candidates = torch.nonzero(disagree)[:, 0]
        keep = confirm_divergence(large, tokenizer.decode, chunks, candidates, features["small_top1"],
                                  features["large_top1"], tokens=args.confirm_tokens, batch_size=args.batch_size * 4,
                                  pad_id=pad)
        features["divergent"] = torch.zeros_like(disagree)
        features["divergent"][candidates[keep]] = True
    return features


def _cache_key(args: argparse.Namespace, corpus_root: Path) -> dict[str, Any]:
    keys = ("max_files", "max_tokens", "seq_len", "chunks_per_file", "top_k", "confirm_tokens", "seed")
    return {"small": str(args.small.resolve()), "large": str(args.large.resolve()), "corpus": str(corpus_root),
            **{k: getattr(args, k) for k in keys}}


def _features(args: argparse.Namespace, chunks: list[list[int]], tokenizer: Any, key: dict) -> dict[str, torch.Tensor]:
    if args.cache and args.cache.is_file():
        cached = torch.load(args.cache, weights_only=True)
        if cached.get("key") == key:
            print(f"train-router: reusing features from {args.cache}")
            return cached["features"]
    features = collect(args, chunks, tokenizer)
    if args.cache:
        args.cache.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"key": key, "features": features}, args.cache)
    return features


def _architecture(algo: str, args: argparse.Namespace, hidden: int, vocab: int) -> dict[str, Any]:
    if algo == "r2r":
        return {"kind": "r2r", "hidden_size": hidden, "vocab_size": vocab, "top_k": args.top_k,
                "d_model": args.d_model, "depth": args.blocks, "expansion": args.expansion}
    return {"kind": "hidden_head", "hidden_size": hidden, "width": args.head_width, "depth": args.head_depth}


def train_one(algo: str, args: argparse.Namespace, features: dict[str, torch.Tensor], split: tuple,
              info: dict[str, Any]) -> dict[str, Any]:
    """Train, pick the threshold, write the router; returns the summary row."""
    started = time.monotonic()
    hidden = features["small_hidden"]
    if algo in ("r2r", "citer"):
        labels = features["divergent"]
    else:
        labels = features["large_logp_next"] > features["small_logp_next"]
    arch = _architecture(algo, args, hidden.shape[1], features["embedding"].shape[0])
    torch.manual_seed(args.seed)
    network = build_network(arch)
    if algo == "r2r":
        network.token_embedding.copy_(features["embedding"])
        inputs: tuple[torch.Tensor, ...] = (hidden, features["small_top1"], features["small_topk"])
    else:
        inputs = (hidden,)
    train, val = split
    result = train_network(network, inputs, labels, train, val, epochs=args.epochs, batch_size=args.train_batch,
                           lr=args.lr, weight_decay=args.weight_decay, seed=args.seed, desc=f"train {algo}")
    choice = pick_threshold(result.val_scores, labels[val], args.target_recall)
    metrics: dict[str, float | None] = {
        "label_positive_rate": float(labels.float().mean()),
        "val_positive_rate": float(labels[val].float().mean()),
        "val_auc": result.val_auc, "train_auc": result.train_auc, "best_epoch": result.best_epoch,
        "val_recall": choice.recall, "val_precision": choice.precision, "val_route_rate": choice.route_rate,
        "train_positions": len(train), "val_positions": len(val),
    }
    metrics = {key: None if isinstance(value, float) and math.isnan(value) else value  # JSON has no NaN
               for key, value in metrics.items()}
    metadata = {
        "algorithm": algo, "architecture": arch, "threshold": choice.threshold, "target_recall": args.target_recall,
        "label": LABELS[algo] + (f", confirmed by {args.confirm_tokens}-token continuations"
                                 if args.confirm_tokens and algo != "co_llm" else ""),
        "metrics": metrics,
        "training": {**info, "parameters": count_parameters(network), "epochs": args.epochs, "lr": args.lr,
                     "weight_decay": args.weight_decay, "train_batch": args.train_batch, "seed": args.seed,
                     "val_fraction": args.val_fraction},
    }
    out = save_router(args.out / algo, network, metadata)
    return {"algo": algo, "out": out, "threshold": choice.threshold, "seconds": time.monotonic() - started, **metrics}


def print_summary(rows: list[dict[str, Any]], info: dict[str, Any]) -> None:
    print(f"\ncorpus: {info['files']} files, {info['chunks']} chunks, {info['positions']} labelled positions; "
          f"small/large top-1 agreement {info['top1_agreement']:.3f}")
    header = (f"{'algo':8} {'pos.rate':>8} {'threshold':>10} {'recall':>7} {'route':>7} {'prec.':>7} "
              f"{'val AUC':>8} {'train AUC':>9} {'s':>6}")
    print(header)
    def auc(value: float | None, width: int) -> str:
        return f"{value:{width}.4f}" if value is not None else f"{'n/a':>{width}}"

    for r in rows:
        print(f"{r['algo']:8} {r['label_positive_rate']:8.3f} {r['threshold']:10.4g} {r['val_recall']:7.3f} "
              f"{r['val_route_rate']:7.3f} {r['val_precision']:7.3f} {auc(r['val_auc'], 8)} {auc(r['train_auc'], 9)} "
              f"{r['seconds']:6.1f}")
    for r in rows:
        print(f"{r['algo']}: {r['out']}")


def run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    for path in (args.small, args.large):
        _check_model_dir(path)
    tokenizer = AutoTokenizer.from_pretrained(args.small)
    if AutoTokenizer.from_pretrained(args.large).get_vocab() != tokenizer.get_vocab():
        raise SystemExit("train-router: the two models do not share one tokenizer; token-level routing needs one")
    root = (args.corpus or stdlib_dir()).resolve()
    files = corpus_files(root, args.max_files)
    corpus = make_corpus(lambda text: tokenizer.encode(text, add_special_tokens=False), files, seq_len=args.seq_len,
                         max_tokens=args.max_tokens, chunks_per_file=args.chunks_per_file, seed=args.seed)
    if not corpus.chunks:
        raise SystemExit(f"train-router: no usable .py files under {root}")
    features = _features(args, corpus.chunks, tokenizer, _cache_key(args, root))
    chunk_ids, _ = position_index(corpus.chunks)
    split = split_by_chunk(chunk_ids, args.val_fraction, args.seed)
    info = {
        "small": args.small.name, "large": args.large.name, "corpus": str(root), "files": corpus.files,
        "chunks": len(corpus.chunks), "positions": corpus.positions, "seq_len": args.seq_len,
        "confirm_tokens": args.confirm_tokens,
        "top1_agreement": float((features["small_top1"] == features["large_top1"]).float().mean()),
        "torch": torch.__version__,
    }
    rows = [train_one(algo, args, features, split, info) for algo in args.algo]
    print_summary(rows, info)
    return 0
