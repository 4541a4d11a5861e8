"""The `tokenrouter` command. Each subcommand lives in its own module and is imported only when used,
so `tokenrouter --help` stays fast and one broken tool cannot break the others."""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help). Each module defines configure(parser) and run(args) -> int.
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("tokenrouter.launch.serve", "run Triton with the TokenRouter model repository"),
    "fleet": ("tokenrouter.fleet.launcher", "replicas of the pair behind NVIDIA Dynamo's OpenAI frontend"),
    "build-repository": ("tokenrouter.launch.build_repository", "render a model repository from a YAML config"),
    "models": ("tokenrouter_engines.models", "install the real model pair or make tiny test pairs"),
    "throughput": ("tokenrouter_tools.throughput_cli", "predict throughput and the best batch thresholds"),
    "bench": ("tokenrouter_tools.bench", "run the benchmark suite"),
    "bench-engine": ("tokenrouter_tools.bench_engine", "our engine vs transformers generate on the same weights"),
    "bench-vllm": ("tokenrouter_tools.bench_vllm",
                   "vLLM step engine vs vLLM native vs torch; routing vs the large model alone"),
    "train-router": ("tokenrouter_tools.train_router", "train a router for a model pair"),
    "quality": ("tokenrouter_tools.quality_bench", "HumanEval pass@1 per policy on the real pair"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="tokenrouter", description="Token-level LLM routing on Triton.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        parser.parse_args(argv or ["--help"])
        return 2
    name = argv[0]
    module = importlib.import_module(COMMANDS[name][0])
    command_parser = argparse.ArgumentParser(prog=f"tokenrouter {name}", description=COMMANDS[name][1])
    module.configure(command_parser)
    return int(module.run(command_parser.parse_args(argv[1:])) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
