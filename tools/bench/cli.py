"""`tokenrouter bench SUITE ...`: run one suite, print markdown, write JSON (and a PNG plot).

    tokenrouter bench validate [--N 2 3 4 5 6 7 8] [--reps 1]          model vs measurement (simulated)
    tokenrouter bench step-costs --config C --N 8 --out pair.yaml      step costs for `tokenrouter throughput`
    tokenrouter bench compare --pair sim|tiny|real [--clients 8]       systems side by side, ratios vs targets
    tokenrouter bench sweep --pair sim [--concurrency 1 2 4 8 16]       workloads x concurrency x systems
    tokenrouter bench served [--config configs/tiny.yaml] [--clients 8 ...]  Triton gRPC vs embedded
    tokenrouter bench served --systems served openai                   the OpenAI server vs gRPC
    tokenrouter bench served --systems served two-servers [--peer-delays-ms 0.5 2]  one model per server (27)
    tokenrouter bench served --config configs/sim-a100.yaml --clients 64 --systems served dynamo  Dynamo's hop
    tokenrouter bench fleet [--per-replica 32] [--replicas 1 2 4]      replicas behind Dynamo: throughput per replica
    tokenrouter bench pools [--clients 48] [--budget 6] [--rates 0.35 0.05]  pairs vs pool splits, with predictions
    tokenrouter bench against REF [--rounds 3] [--served "OPTIONS"]   this tree vs commit REF, served suite
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any, Callable

from . import against, compare, fleet, pool_splits, served, sweep, validate
from .plots import plot_compare, plot_fleet, plot_pool_splits, plot_served, plot_sweep, plot_validate
from .report import machine, write_json
from .runner import Timing
from .setups import PAIR_SETUPS, make_setup
from .systems import SYSTEMS, SystemFactory
from .workloads import KINDS as WORKLOADS

RESULTS = Path("results")
SIM_A100 = Path(__file__).resolve().parents[2] / "configs" / "sim-a100.yaml"
# (warm-up, measurement window) seconds per pair setup: short by default, --measure-s for more
DEFAULT_TIMING = {"sim": (1.0, 4.0), "tiny": (2.0, 6.0), "real": (20.0, 60.0)}
DEFAULT_COMPARE = {"sim": list(SYSTEMS), "tiny": list(SYSTEMS), "real": ["llm_only", "slm_only", "tokenrouter"]}
DEFAULT_SWEEP = ["llm_only", "std_serving", "r2r_lockstep", "eager_async", "tokenrouter"]


def configure(parser: argparse.ArgumentParser) -> None:
    suites = parser.add_subparsers(dest="suite", metavar="SUITE", required=True)

    p = suites.add_parser("validate", help="throughput model vs measured throughput on the simulated engine")
    p.add_argument("--N", type=int, nargs="+", default=list(range(2, 9)), help="concurrencies (default 2..8)")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="run the simulated clock this many times slower (throughput converted back)")
    p.add_argument("--workload", choices=("short-long", "long-short"), default="short-long")
    p.add_argument("--prefill-cost", action="store_true",
                   help="keep the profiles' per-token prefill/extend cost, and charge it in the model (else zeroed)")
    p.add_argument("--monte-carlo", type=int, default=0, metavar="EVENTS",
                   help="also the discrete-event simulation per cell, with this many batch completions")
    _common(p, reps=1, pair=False)

    p = suites.add_parser("compare", help="all systems side by side at one concurrency, ratios vs targets")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, metavar="SYSTEM",
                   help=f"of {', '.join(SYSTEMS)}; default: all (real: llm_only slm_only tokenrouter)")
    p.add_argument("--workload", choices=WORKLOADS, default="short-long")
    _common(p, reps=3)

    p = suites.add_parser("sweep", help="concurrency sweep over workloads and systems")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=DEFAULT_SWEEP, metavar="SYSTEM",
                   help=f"of {', '.join(SYSTEMS)}; default: {' '.join(DEFAULT_SWEEP)}")
    p.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    _common(p, reps=1)

    p = suites.add_parser("served", help="served (Triton gRPC) vs embedded vs the OpenAI server on one config")
    p.add_argument("--config", type=Path, help="YAML config (default: configs/tiny.yaml on the tiny pair; "
                                              "configs/sim-a100.yaml: the simulated A100 pair)")
    p.add_argument("--clients", type=int, nargs="+", default=[8], help="concurrencies, all on one server")
    p.add_argument("--systems", nargs="+", choices=served.SYSTEMS, default=list(served.DEFAULT_SYSTEMS),
                   metavar="SYSTEM", help="of embedded (the Python API), served (Triton gRPC), openai (the OpenAI "
                                          "server beside Triton), two-servers (one model per Triton server on "
                                          "loopback), dynamo (one replica behind NVIDIA Dynamo's frontend); "
                                          "default: embedded served")
    p.add_argument("--peer-delays-ms", type=float, nargs="+", default=[0.0], metavar="MS",
                   help="two-servers: one deployment per delay added to every peer message (transport.delay_ms), "
                        "each compared with the one without (default: 0 only)")
    _common(p, reps=3, pair=False)

    p = suites.add_parser("fleet", help="replicas of the pair behind NVIDIA Dynamo: throughput per replica")
    p.add_argument("--config", type=Path, default=SIM_A100, help="YAML config (default configs/sim-a100.yaml)")
    p.add_argument("--replicas", type=int, nargs="+", default=list(fleet.REPLICA_COUNTS),
                   help="fleet sizes, all up at once, runs alternated (default 1 2 4; the first is the reference)")
    p.add_argument("--per-replica", type=int, default=32, help="closed-loop clients per replica (default 32)")
    _common(p, reps=3, pair=False)

    p = suites.add_parser("pools", help="a worker budget as pairs and as every pool split behind NVIDIA Dynamo, "
                                        "measured beside the throughput model's prediction")
    p.add_argument("--config", type=Path, default=SIM_A100, help="a simulated pair's YAML config "
                                                                 "(default configs/sim-a100.yaml)")
    p.add_argument("--clients", type=int, default=48, help="closed-loop clients, N (default 48)")
    p.add_argument("--budget", type=int, default=6, help="workers in all, an even number (default 6)")
    p.add_argument("--rates", type=float, nargs="+", default=[0.35, 0.05],
                   help="random routing rates to the large model, back after one token (default 0.35 0.05)")
    _common(p, reps=3, pair=False)

    p = suites.add_parser("step-costs", help="an engine pair's step costs as the throughput model takes them "
                                             "(decode per batch size, per-token and per-arrival feed costs)")
    p.add_argument("--config", type=Path, default=SIM_A100, help="YAML config whose models are measured "
                                                                 "(default configs/sim-a100.yaml)")
    p.add_argument("--N", type=int, default=8, help="largest batch size (= concurrent requests), default 8")
    p.add_argument("--context", type=int, default=256, help="tokens each measured sequence prefills first")
    p.add_argument("--extends", type=int, nargs="+", default=[1, 8, 64], help="extend sizes k timed (default 1 8 64)")
    p.add_argument("--samples", type=int, default=3, help="timed steps per point (median)")
    p.add_argument("--rate", type=float, help="write P and C of random routing at this rate into the file")
    p.add_argument("--prompt-tokens", type=int, nargs=2, metavar=("LO", "HI"), help="the workload's prompts")
    p.add_argument("--output-tokens", type=int, help="the workload's output tokens per request")
    p.add_argument("--out", type=Path, help="write the `tokenrouter throughput --file` YAML here")
    p.add_argument("--json", type=Path, help="raw results (default results/bench-step-costs-<config>.json)")
    p.set_defaults(plot=None, markdown=None)

    p = suites.add_parser("against", help="this tree vs a baseline commit: the served suite, runs alternated")
    p.add_argument("ref", help="the baseline: a commit, branch or tag (e.g. HEAD~1)")
    p.add_argument("--rounds", type=int, default=3, help="runs per tree, alternated (default 3)")
    p.add_argument("--served", default="", metavar="OPTIONS",
                   help="`bench served` options for both trees, as one string (e.g. \"--config "
                        "configs/sim-a100.yaml --clients 64\")")
    p.add_argument("--json", type=Path, help="raw results (default results/bench-against-<ref>.json)")
    p.add_argument("--markdown", type=Path, help="also write the markdown table here")
    p.set_defaults(plot=None)


def _common(p: argparse.ArgumentParser, *, reps: int, pair: bool = True) -> None:
    if pair:
        p.add_argument("--pair", choices=PAIR_SETUPS, default="sim", help="the model pair to run on (default sim)")
        p.add_argument("--rate", type=float, help="random routing rate small -> large (default: sim 0.35, "
                                                    "tiny 0.3, real 0.1)")
        p.add_argument("--threads", type=int, help="torch threads per engine (tiny default 1, real 2)")
    p.add_argument("--reps", type=int, default=reps, help=f"repetitions (default {reps}); medians are reported")
    p.add_argument("--warmup-s", type=float, help="seconds before the window opens (default per pair setup)")
    p.add_argument("--measure-s", type=float, help="measurement window, seconds (default per pair setup)")
    p.add_argument("--max-tokens", type=int, help="override the workload's output cap")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="raw results (default results/bench-<suite>-<pair>.json)")
    p.add_argument("--plot", type=Path, help="write a PNG plot here")
    p.add_argument("--markdown", type=Path, help="also write the markdown tables here")


def _timing(args: argparse.Namespace, kind: str) -> Timing:
    warmup, window = DEFAULT_TIMING[kind]
    return Timing(args.warmup_s if args.warmup_s is not None else warmup,
                  args.measure_s if args.measure_s is not None else window)


def _factory(args: argparse.Namespace) -> SystemFactory:
    setup = make_setup(args.pair, rate=args.rate, threads=args.threads)
    return SystemFactory(setup, setup.open_engines(), setup.codec())


def _validate(args: argparse.Namespace) -> tuple[dict[str, Any], Callable, Callable, str]:
    result = validate.run_validate(args.N, _timing(args, "sim"), reps=args.reps, seed=args.seed,
                                   max_tokens=args.max_tokens, time_scale=args.time_scale,
                                   workload_kind=args.workload, prefill_cost=args.prefill_cost,
                                   monte_carlo=args.monte_carlo)
    return result, validate.markdown, plot_validate, "sim"


def _compare(args: argparse.Namespace) -> tuple[dict[str, Any], Callable, Callable, str]:
    factory = _factory(args)
    systems = args.systems or DEFAULT_COMPARE[args.pair]
    result = compare.run_compare(factory, systems, args.clients, factory.setup.with_workload(args.workload,
                                                                                             args.max_tokens),
                                 _timing(args, args.pair), reps=args.reps, seed=args.seed)
    return result, compare.markdown, plot_compare, args.pair


def _sweep(args: argparse.Namespace) -> tuple[dict[str, Any], Callable, Callable, str]:
    result = sweep.run_sweep(_factory(args), args.systems, args.concurrency, args.workloads,
                             _timing(args, args.pair), reps=args.reps, seed=args.seed, max_tokens=args.max_tokens)
    return result, sweep.markdown, plot_sweep, args.pair


def _served(args: argparse.Namespace) -> tuple[dict[str, Any], Callable, Callable, str]:
    from tokenrouter.config import load_config

    from tokenrouter.launch.serve import TINY_CONFIG
    from .setups import tiny_setup

    setup = tiny_setup()  # builds the tiny pair if needed; its text workload sizes fit tiny.yaml
    config = load_config(args.config or TINY_CONFIG)
    result = served.run_served(config, args.clients, setup.with_workload("short-long", args.max_tokens),
                               _timing(args, "tiny"), reps=args.reps, seed=args.seed, systems=args.systems,
                               peer_delays_ms=sorted({0.0, *args.peer_delays_ms}))
    return result, served.markdown, plot_served, "tiny" if args.config is None else Path(args.config).stem


def _fleet(args: argparse.Namespace) -> tuple[dict[str, Any], Callable, Callable, str]:
    from tokenrouter.config import load_config

    from .setups import tiny_setup

    setup = tiny_setup()  # the text workload sizes of the served suite
    result = fleet.run_replicas(load_config(args.config), args.per_replica,
                                setup.with_workload("short-long", args.max_tokens), _timing(args, "tiny"),
                                reps=args.reps, seed=args.seed, counts=args.replicas)
    return result, fleet.markdown, plot_fleet, Path(args.config).stem


def _pools(args: argparse.Namespace) -> tuple[dict[str, Any], Callable, Callable, str]:
    from tokenrouter.config import load_config

    from .setups import tiny_setup

    if args.budget < 2 or args.budget % 2:
        raise SystemExit("--budget: an even number of workers, at least 2 (the pairs are the reference)")
    result = pool_splits.run_pool_splits(load_config(args.config), args.clients,
                                         tiny_setup().with_workload("short-long", args.max_tokens),
                                         _timing(args, "tiny"), reps=args.reps, rates=args.rates,
                                         budget=args.budget, seed=args.seed)
    return result, pool_splits.markdown, plot_pool_splits, Path(args.config).stem


def _against(args: argparse.Namespace) -> tuple[dict[str, Any], Callable, None, str]:
    result = against.run_against(args.ref, shlex.split(args.served), args.rounds)
    return result, against.markdown, None, args.ref.replace("/", "-")


def _step_costs(args: argparse.Namespace) -> tuple[dict[str, Any], Callable, None, str]:
    import yaml

    from tokenrouter.config import load_config
    from tokenrouter.engine.factory import create_engine

    from .step_costs import measure_step_costs, pair_file

    config = load_config(args.config)
    costs = {}
    for name, spec in config.models.items():  # one engine at a time: each gets the machine to itself
        # N + 1 sequences are held at once (N decode rows beside the extending one)
        engine = create_engine(name, spec.model_copy(update={"max_batch_size": max(spec.max_batch_size, args.N + 1)}))
        try:
            costs[name] = measure_step_costs(engine, args.N, context=args.context, extends=args.extends,
                                             samples=args.samples)
        finally:
            engine.close()
    inputs = pair_file(costs, list(config.models), rate=args.rate, N=args.N,
                       prompt_tokens=tuple(args.prompt_tokens) if args.prompt_tokens else None,
                       output_tokens=args.output_tokens)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(yaml.safe_dump(inputs, default_flow_style=None, sort_keys=False))
    return {"suite": "step-costs", "config": str(args.config), "costs": costs, "inputs": inputs}, \
        lambda result: yaml.safe_dump(result["inputs"], default_flow_style=None, sort_keys=False), None, \
        Path(args.config).stem


SUITES = {"validate": _validate, "step-costs": _step_costs, "compare": _compare, "sweep": _sweep, "served": _served,
          "fleet": _fleet, "pools": _pools, "against": _against}


def run(args: argparse.Namespace) -> int:
    at_start = machine()  # the load average of a shared machine belongs next to its numbers
    result, markdown, plot, name = SUITES[args.suite](args)
    result["machine_at_start"] = at_start
    text = markdown(result)
    print(text)
    json_path = write_json(args.json or RESULTS / f"bench-{args.suite}-{name}.json", result)
    print(f"\nraw results: {json_path}")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text + "\n")
    if args.plot and plot is not None:
        print(f"plot: {plot(result, args.plot)}")
    return 0
