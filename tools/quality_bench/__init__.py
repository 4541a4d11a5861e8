"""`tokenrouter quality`: HumanEval pass@1 per routing policy on the real pair, with the large
model's token share and throughput, as JSON, a markdown table and a cost-quality frontier plot.

Results accumulate in ``--out``: a setting already there for the same problems and generation
settings is not run again (``--force`` starts the file afresh), so a long benchmark can be run
a few policies at a time and the table and plot always cover everything measured.
"""

from __future__ import annotations

import argparse
import os
import platform
from pathlib import Path
from typing import Any

from tokenrouter.config import load_config
from tokenrouter.launch.paths import routers_dir, shipped_config

from .humaneval import MODES, load_problems
from .report import markdown_table, plot_frontier, read_json, summarize, write_json
from .runner import PolicyRun, load_engines, run_setting, warm_up
from .settings import PRESETS, parse_settings

DEFAULT_CONFIG = shipped_config("qwen2.5-coder.yaml")
DEFAULT_ROUTERS = routers_dir()
# meta fields that must agree before runs from an earlier invocation are reused
COMPARABLE = ("config", "mode", "max_tokens", "task_ids", "threads", "max_active")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the model pair (its policy is replaced)")
    parser.add_argument("--policies", default=",".join(PRESETS),
                        help="comma-separated settings: NAME (preset params) or NAME:key=value[:key=value] "
                             f"(default: every policy's preset; policies: {', '.join(PRESETS)})")
    parser.add_argument("--subset", type=int, default=None, help="only N problems (default: all 164)")
    parser.add_argument("--sample-seed", type=int, default=None,
                        help="with --subset: a seeded sample of N problems instead of the first N")
    parser.add_argument("--mode", choices=MODES, default="prefill",
                        help="prefill: chat turn with the answer begun as the prompt's code (default); plain: raw "
                             "code completion; chat: instruction, code block extracted (see docs/quality.md)")
    parser.add_argument("--max-tokens", type=int, default=256, help="output cap per problem")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per model (default 1: 2 in all)")
    parser.add_argument("--max-active", type=int, default=None, help="concurrent requests (default: the config's)")
    parser.add_argument("--routers", type=Path, default=DEFAULT_ROUTERS,
                        help="trained routers, one folder per algorithm (tokenrouter train-router --out)")
    parser.add_argument("--judge-timeout", type=float, default=10.0, help="sandbox wall-clock limit per problem (s)")
    parser.add_argument("--out", type=Path, default=Path("results/quality.json"))
    parser.add_argument("--table", type=Path, default=None, help="also write the markdown table here")
    parser.add_argument("--plot", type=Path, default=None, help="frontier plot (default: --out with .png)")
    parser.add_argument("--force", action="store_true", help="ignore results already in --out")


def run(args: argparse.Namespace) -> int:
    settings = parse_settings(args.policies)
    problems = load_problems(args.subset, args.sample_seed)
    base = load_config(args.config)
    overrides: dict[str, Any] = {"models": {name: {**spec.model_dump(), "threads": args.threads}
                                            for name, spec in base.models.items()}}
    if args.max_active is not None:
        overrides["scheduling"] = {**base.scheduling.model_dump(), "max_active": args.max_active}
    base = load_config({**base.model_dump(), **overrides})
    meta = {"config": str(args.config.resolve()), "mode": args.mode, "max_tokens": args.max_tokens,
            "task_ids": [p["task_id"] for p in problems], "threads": args.threads,
            "max_active": base.scheduling.max_active, "temperature": 0.0,
            "judge_timeout_s": args.judge_timeout, "cpu_count": os.cpu_count(), "machine": platform.platform()}
    runs = _previous_runs(args.out, meta) if not args.force else []
    done = {run.label for run in runs}
    todo = [s for s in settings if s.label not in done]
    print(f"quality: {len(problems)} problems, mode {args.mode}, max_tokens {args.max_tokens}; "
          f"running {', '.join(s.label for s in todo) or 'nothing'}"
          + (f"; reusing {', '.join(sorted(done))} from {args.out}" if done else ""))
    plot_path = args.plot or args.out.with_suffix(".png")
    if todo:
        engines = load_engines(base)
        try:
            warm_up(base, engines)
            for setting in todo:
                result = run_setting(base, engines, problems, setting, mode=args.mode, max_tokens=args.max_tokens,
                                     routers=args.routers, judge_timeout_s=args.judge_timeout)
                runs = [r for r in runs if r.label != setting.label] + [result]
                _write(args, meta, runs, plot_path)  # after every setting: a crash keeps what was measured
        finally:
            for engine in engines.values():
                engine.close()
    _write(args, meta, runs, plot_path)
    print(markdown_table(summarize(runs)), end="")
    return 0


def _previous_runs(path: Path, meta: dict[str, Any]) -> list[PolicyRun]:
    if not path.is_file():
        return []
    old_meta, runs = read_json(path)
    differs = [key for key in COMPARABLE if old_meta.get(key) != meta[key]]
    if differs:
        raise SystemExit(f"quality: {path} holds results for other settings ({', '.join(differs)} differ); "
                         f"use another --out or --force")
    return runs


def _write(args: argparse.Namespace, meta: dict[str, Any], runs: list[PolicyRun], plot_path: Path) -> None:
    write_json(args.out, meta, runs)
    rows = summarize(runs)
    if args.table:
        args.table.parent.mkdir(parents=True, exist_ok=True)
        args.table.write_text(markdown_table(rows))
    title = (f"HumanEval pass@1 vs throughput, Qwen2.5-Coder 0.5B/1.5B Instruct, "
             f"N={len(meta['task_ids'])}, {meta['mode']}, greedy")
    plot_frontier(rows, plot_path, title)
