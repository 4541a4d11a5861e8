"""`tokenrouter throughput`: predicted throughput over delayed-batching thresholds B, and B*.

Inputs come from flags or a YAML/JSON file (keys P, C, L_ms, delta_ms, N, B; flags override), or
``--paper`` for the TokenRouter paper's example (R2R, Qwen3-0.6B/32B on A100). Latencies are in
milliseconds here; an L entry may be a list, one latency per batch size 1..N, or grow by a slope per
row (``L_slope_ms``). ``--pools BUDGET`` sizes pools of workers instead (``throughput_pools.py``).
With ``per_token_ms``, ``prompt_tokens`` and ``output_tokens`` (and optionally ``arrival_ms``) L are
decode steps and every row is also charged its prefill/extend cost (``tokenrouter.throughput.prefill``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from tokenrouter.throughput import best_thresholds, predict
from tokenrouter.throughput.montecarlo import simulate
from tokenrouter.throughput.inputs import check_matrices
from tokenrouter.throughput.prefill import PrefillCosts, per_row_charge

from .throughput_pools import report_pools

PAPER: dict[str, Any] = {"P": [[0.65, 0.35], [1.0, 0.0]], "C": [[1, 0], [1, 0]], "L_ms": [6.0, 27.9],
                         "delta_ms": 0.1, "N": [2, 3, 4]}


def _matrix(text: str) -> list[list[float]]:
    """'0.65,0.35;1,0' -> [[0.65, 0.35], [1.0, 0.0]]"""
    try:
        return [[float(x) for x in row.split(",")] for row in text.split(";")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a matrix like '0.65,0.35;1,0'") from None


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--paper", action="store_true", help="the paper's example: p=0.35, L=6.0/27.9 ms, N=2,3,4")
    parser.add_argument("--file", type=Path, help="YAML or JSON with P, C, L_ms, delta_ms, N and optionally B")
    parser.add_argument("--P", type=_matrix, help="routing probabilities, rows ';'-separated: '0.65,0.35;1,0'")
    parser.add_argument("--C", type=_matrix, help="committed tokens per transition, same layout as --P")
    parser.add_argument("--L-ms", dest="L_ms", type=float, nargs="+", help="step latency per model (ms)")
    parser.add_argument("--L-slope-ms", dest="L_slope_ms", type=float, nargs="+",
                        help="per model, ms added to its step per row past the first: L(b) = L + slope * (b - 1)")
    parser.add_argument("--delta-ms", dest="delta_ms", type=float, help="time grid (ms); must divide every latency")
    parser.add_argument("--N", type=int, nargs="+", help="concurrent requests (one or more)")
    parser.add_argument("--B", type=int, nargs="+", help="predict only these thresholds instead of searching")
    parser.add_argument("--snap", action="store_true", help="round latencies to the grid instead of failing")
    parser.add_argument("--top", type=int, default=0, help="print only the best TOP rows per N (default: all)")
    parser.add_argument("--monte-carlo", dest="monte_carlo", type=int, default=0, metavar="EVENTS",
                        help="add a discrete-event simulation column with this many batch completions")
    parser.add_argument("--handoff-ms", dest="handoff_ms", type=float, default=0.0,
                        help="latency of every handoff between models on different servers (ms): the chain adds "
                             "it to the step of each model rows leave, the simulation delays each moved row")
    parser.add_argument("--no-chain", dest="chain", action="store_false",
                        help="with --monte-carlo and --B: only the simulation (the chain is too large past "
                             "N of about 16; e.g. N = 64)")
    parser.add_argument("--per-token-ms", dest="per_token_ms", type=float, nargs="+",
                        help="per model, ms a step costs per prefill/extend token past a row's first; with "
                             "--prompt-tokens and --output-tokens the model charges first-visit prefills and extends")
    parser.add_argument("--arrival-ms", dest="arrival_ms", type=float, nargs="+",
                        help="per model, ms a step costs per arriving row (a prefill or a resume), default 0")
    parser.add_argument("--prompt-tokens", dest="prompt_tokens", type=int, nargs=2, metavar=("LO", "HI"),
                        help="prompt length of a new request, uniform in [LO, HI]")
    parser.add_argument("--output-tokens", dest="output_tokens", type=int,
                        help="tokens a request commits before it ends (a new one starts at the entry)")
    parser.add_argument("--pools", type=int, metavar="BUDGET",
                        help="size pools instead: simulated throughput of every split of BUDGET workers over the "
                             "models (requests pinned to one instance of each), and the best; thresholds from --B "
                             "(default 1 each), completions from --monte-carlo (default 40000)")
    parser.add_argument("--search-B", dest="search_B", type=int, default=0, metavar="MAX",
                        help="with --pools: each split runs its best thresholds in 1..MAX per model (MAX^M "
                             "simulations per split) instead of --B")
    parser.add_argument("--pairs-chain", dest="pairs_chain", action="store_true",
                        help="with --pools: also solve the chain (needs delta) for splits with as many workers per "
                             "model, which are independent pairs (minutes past about 12 requests per pair)")


def _inputs(args: argparse.Namespace) -> dict[str, Any]:
    values: dict[str, Any] = dict(PAPER) if args.paper else {}
    if args.file:
        loaded = yaml.safe_load(args.file.read_text())
        if not isinstance(loaded, dict):
            raise ValueError(f"{args.file}: expected a mapping with P, C, L_ms, delta_ms, N")
        values.update(loaded)
    values.update({key: getattr(args, key) for key in ("P", "C", "L_ms", "L_slope_ms", "delta_ms", "N", "B",
                                                       "per_token_ms", "arrival_ms", "prompt_tokens", "output_tokens")
                   if getattr(args, key) is not None})
    if not args.chain and not (args.monte_carlo and values.get("B")):
        raise ValueError("--no-chain needs --monte-carlo and --B (one B to simulate)")
    simulated_only = args.pools is not None and not args.pairs_chain  # the simulation needs no grid
    required = ("P", "C", "L_ms", "N") if simulated_only else ("P", "C", "L_ms", "delta_ms", "N")
    missing = [key for key in required if key not in values]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}: give --paper, --file or the flags")
    values["N"] = [values["N"]] if isinstance(values["N"], int) else list(values["N"])
    values["L"] = _latencies(values["L_ms"], values.get("L_slope_ms"), max(values["N"]))
    values["delta"] = values["delta_ms"] / 1e3 if "delta_ms" in values else None
    values["prefill"] = _prefill(values)
    if values["prefill"] is not None and args.pools is not None:
        raise ValueError("--pools does not charge prefills yet: leave out per_token_ms, prompt_tokens, output_tokens")
    return values


def _prefill(values: dict[str, Any]) -> PrefillCosts | None:
    keys = ("per_token_ms", "prompt_tokens", "output_tokens")
    given = [key for key in keys if values.get(key) is not None]
    if not given and values.get("arrival_ms") is None:
        return None
    if len(given) < len(keys):
        raise ValueError(f"prefill charges need all of {', '.join(keys)}; got only {', '.join(given) or 'arrival_ms'}")
    arrival = values.get("arrival_ms")
    return PrefillCosts(tuple(x / 1e3 for x in values["per_token_ms"]), tuple(values["prompt_tokens"]),
                        values["output_tokens"], tuple(x / 1e3 for x in arrival) if arrival is not None else None)


def _latencies(L_ms: list, slopes_ms: list[float] | None, N: int) -> list:
    """Seconds per model: a number, or one per batch size 1..N (a list given, or a slope per row)."""
    if slopes_ms is None:
        return [[x / 1e3 for x in entry] if isinstance(entry, list) else entry / 1e3 for entry in L_ms]
    if len(slopes_ms) != len(L_ms) or any(isinstance(entry, list) for entry in L_ms):
        raise ValueError(f"L_slope_ms needs one slope per model ({len(L_ms)}) and one number per model in L_ms")
    return [[(base + slope * b) / 1e3 for b in range(N)] for base, slope in zip(L_ms, slopes_ms)]


def run(args: argparse.Namespace) -> int:
    try:
        values = _inputs(args)
        if args.pools is not None:
            report_pools(values, args)
            return 0
        print(f"P = {values['P']}\nC = {values['C']}\nL = {values['L_ms']} ms, delta = {values['delta_ms']} ms"
              + (f", handoff = {args.handoff_ms:g} ms" if args.handoff_ms else ""))
        if values["prefill"] is not None:
            print(_describe(values["prefill"], values))
        for n in values["N"]:
            _report(values, n, args)
    except (ValueError, OSError, yaml.YAMLError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def _describe(prefill: PrefillCosts, values: dict[str, Any]) -> str:
    charge = per_row_charge(*check_matrices(values["P"], values["C"]), prefill)
    def ms(values: tuple[float, ...]) -> str:
        return "/".join(f"{x * 1e3:.4g}" for x in values)
    return (f"prefill: {ms(prefill.per_token_s)} ms per fed token, {ms(prefill.arrival)} ms per arriving row, "
            f"prompts {prefill.prompt_tokens[0]}-{prefill.prompt_tokens[1]} tokens, {prefill.output_tokens} out; "
            f"charge per row {ms(tuple(charge))} ms (latencies snapped to the grid)")


def _report(values: dict[str, Any], n: int, args: argparse.Namespace) -> None:
    P, C, L, delta = values["P"], values["C"], values["L"], values["delta"]
    prefill = values["prefill"]
    snap = args.snap or prefill is not None  # charged latencies are rarely grid multiples
    handoff_s = args.handoff_ms / 1e3
    started = time.perf_counter()
    if values.get("B"):
        best = tuple(values["B"])
        table = {best: predict(P, C, L, values["B"], n, delta, snap=snap, handoff_s=handoff_s, prefill=prefill)
                 if args.chain else float("nan")}
    else:
        best_list, table = best_thresholds(P, C, L, n, delta, snap=snap, handoff_s=handoff_s, prefill=prefill)
        best = tuple(best_list)
    elapsed = time.perf_counter() - started
    shown = sorted(table, key=lambda B: -table[B])[:args.top] if args.top > 0 else sorted(table)
    print(f"\nN = {n}  ({len(table)} thresholds, {elapsed:.2f} s)")
    header = f"  {'B':<14}{'tokens/s':>10}"
    print(header + (f"{'simulated':>12}" if args.monte_carlo else ""))
    for B in shown:
        line = f"{'*' if B == best else ' '} {str(list(B)):<14}{table[B]:>10.2f}"
        if args.monte_carlo:
            line += f"{simulate(P, C, L, B, n, events=args.monte_carlo, handoff_s=handoff_s, prefill=prefill):>12.2f}"
        print(line)
    print(f"B* = {list(best)}  ({table[best]:.2f} tokens/s)")
