"""`tokenrouter throughput --pools BUDGET`: every split of a worker budget over the models, and the best.

Each split is simulated (``tokenrouter.throughput.pools``) with the same seed; with ``--pairs-chain``
the splits with as many workers per model (independent pairs) also get the Markov chain's number.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from tokenrouter.throughput.pools import PoolPrediction, best_split

DEFAULT_EVENTS = 40_000


def report_pools(values: dict[str, Any], args: argparse.Namespace) -> None:
    P, C, L = values["P"], values["C"], values["L"]
    B = values.get("B") or [1] * len(P)
    searched = f"best B in 1..{args.search_B} per split" if args.search_B else f"B = {list(B)} per instance"
    events = args.monte_carlo or DEFAULT_EVENTS
    delta = values["delta"] if args.pairs_chain else None
    print(f"P = {P}\nC = {C}\nL = {values['L_ms']} ms"
          + (f" + {values['L_slope_ms']} ms per row" if values.get("L_slope_ms") else "")
          + f", {searched}" + (f", handoff = {args.handoff_ms:g} ms" if args.handoff_ms else ""))
    for n in values["N"]:
        started = time.perf_counter()
        best, predictions = best_split(P, C, L, B, n, args.pools, search_B=args.search_B, delta=delta,
                                       snap=args.snap, events=events, handoff_s=args.handoff_ms / 1e3)
        print(f"\nN = {n}, {args.pools} workers  ({len(predictions)} splits, {events} completions each, "
              f"{time.perf_counter() - started:.1f} s)")
        print(f"  {'workers':<12}{'B':<10}{'tokens/s':>10}{'per worker':>12}" + (f"{'chain':>10}" if delta else ""))
        for prediction in predictions:
            line = f"{'*' if prediction.workers == best else ' '} {_split(prediction.workers):<12}" \
                   f"{str(list(prediction.B)):<10}{prediction.simulated:>10.1f}{prediction.per_worker:>12.1f}"
            if delta:
                line += f"{prediction.chain:>10.1f}" if prediction.chain is not None else f"{'-':>10}"
            print(line)
        print(_summary(best, predictions))


def _split(workers: tuple[int, ...]) -> str:
    return " + ".join(map(str, workers))


def _summary(best: tuple[int, ...], predictions: list[PoolPrediction]) -> str:
    top = next(p for p in predictions if p.workers == best)
    text = f"best split = {_split(best)}, B = {list(top.B)}  ({top.simulated:.1f} tokens/s)"
    equal = [p for p in predictions if len(set(p.workers)) == 1]
    if equal:
        gain = top.simulated / equal[0].simulated - 1
        text += f"; {equal[0].workers[0]} pairs: {equal[0].simulated:.1f} tokens/s ({gain:+.1%})"
    return text
