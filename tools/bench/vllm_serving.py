"""`tokenrouter bench-vllm serving`: what a user would run instead, each behind its OpenAI API, driven
by the same closed-loop client (streamed or one-token /v1/completions over kept HTTP connections).

- ``tokenrouter``: TokenRouter served: Triton with the pair (one core per model) and the OpenAI server
  beside it (``OpenAITarget``, streamed completions);
- ``std_serving``: Std. Serving on vLLM: one real vLLM OpenAI server per model (prefix caching on,
  one core each) and the external dispatcher asking the current model for one token per call
  (``VllmStdServingTarget``);
- ``large_alone``: the large model alone on one vLLM OpenAI server with both cores (``OpenAITarget``).

Every system runs the same policy object where it routes and the same HumanEval chat prompts, greedy,
the same end ids. Each repetition starts every system afresh in a rotating order (they do not fit in
memory together) and measures it at every N; numbers are medians over repetitions. For Std. Serving
each run also splits the cost of a call with the vLLM servers' /metrics (``call_split``).
"""

from __future__ import annotations

import contextlib
import random
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, Sequence

from tokenrouter.config import ModelSpec, TokenRouterConfig
from tokenrouter.engine.dtypes import resolve_dtype
from tokenrouter.launch.free_ports import free_port
from tokenrouter.launch.openai_process import OpenAIServer
from tokenrouter.launch.triton_install import build_backend_dir, find_triton
from tokenrouter.launch.triton_server import Ports, TritonServer
from tokenrouter.policies import create_policy
from tokenrouter.serving.repository import render_repository
from tokenrouter.text import TextCodec

from . import prometheus
from .openai_target import OpenAITarget
from .records import Prompt, summarize
from .report import fmt, ms, pct, table
from .runner import Timing, closed_loop
from .targets import Target
from .vllm_serve import VllmServe
from .vllm_std_serving import VllmStdServingTarget, vocab_size
from .workloads import Workload

SYSTEMS = ("tokenrouter", "std_serving", "large_alone")
LABELS = {"tokenrouter": "TokenRouter served (OpenAI server + Triton)",
          "std_serving": "Std. Serving on two vLLM servers", "large_alone": "1.5B alone, vLLM server, 2 cores"}
READY_S = 900.0
MAX_MODEL_LEN = 4096  # when the config leaves it to the engine
# vLLM's per-request histograms (seconds) and counters read for the per-call split
HISTOGRAMS = ("vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
              "vllm:request_prefill_time_seconds", "vllm:request_inference_time_seconds")
COUNTERS = ("vllm:prompt_tokens_total", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")

# A system opened: how to make a target, and its vLLM servers by model (whose /metrics split each call)
Opened = tuple[Callable[[], Target], dict[str, VllmServe]]
Opener = Callable[[], ContextManager[Opened]]


class ListedPrompts:
    """Prompts drawn from a fixed list (each client's own seeded generator picks the next)."""

    def __init__(self, texts: Sequence[str]) -> None:
        self.texts = list(texts)

    def make(self, rng: random.Random, tokens: int) -> Prompt:
        return rng.choice(self.texts)

    def join(self, *parts: Prompt) -> Prompt:
        raise NotImplementedError("listed prompts make single-turn workloads only")

    def size(self, prompt: Prompt) -> int:
        return len(prompt)


def _large(config: TokenRouterConfig) -> str:
    return next(name for name in config.model_names if name != config.entry)


def _path(spec: ModelSpec) -> Path:
    if spec.path is None:
        raise ValueError("a vLLM server needs the model's path")
    return Path(spec.path)


def _max_model_len(config: TokenRouterConfig) -> int:
    return config.max_model_len or MAX_MODEL_LEN


@contextlib.contextmanager
def tokenrouter_openai(config: TokenRouterConfig) -> Iterator[Opened]:
    install = find_triton()
    with tempfile.TemporaryDirectory(prefix="bench-vllm-serving-") as tmp:
        repository = render_repository(config, Path(tmp) / "repository")
        log = (Path(tmp) / "server.log").open("w")

        def sink(line: str) -> None:
            log.write(line + "\n")

        server = TritonServer(repository, build_backend_dir(install, Path(tmp) / "backends"), install, Ports.free(),
                              host="127.0.0.1", log_sink=sink, exit_timeout_s=5)
        api = OpenAIServer(repository, server.grpc_url, port=free_port(), log_sink=sink, drain_timeout_s=5)
        try:
            server = server.start_ready(READY_S)
            api.triton_url = server.grpc_url
            api.start().wait_ready(300)
            yield lambda: OpenAITarget(api.url, _large(config), entry=config.entry,
                                       metrics_urls=[f"127.0.0.1:{server.ports.metrics}"]), {}
        finally:
            api.stop(grace_s=5)
            server.stop()
            log.close()


@contextlib.contextmanager
def std_serving_vllm(config: TokenRouterConfig, clients: int, codec: TextCodec,
                     end_ids: list[int]) -> Iterator[Opened]:
    servers = {name: VllmServe(name, _path(spec), spec.cpus or [index], dtype=resolve_dtype(spec, on_gpu=False),
                               max_num_seqs=clients, max_model_len=_max_model_len(config))
               for index, (name, spec) in enumerate(config.models.items())}
    try:
        for server in servers.values():  # one after the other: started together, one failed to start here
            server.start().wait_ready(READY_S)
        vocab = vocab_size(_path(config.models[config.entry]))
        yield (lambda: VllmStdServingTarget({n: s.url for n, s in servers.items()}, create_policy(
            config.policy.name, config.model_names, config.entry, config.policy.params, config.policy.weights),
            large=_large(config), vocab=vocab, codec=codec,
            end_ids=end_ids, max_model_len=_max_model_len(config))), servers
    finally:
        for server in servers.values():
            server.stop()


@contextlib.contextmanager
def large_alone_vllm(config: TokenRouterConfig, clients: int, cores: int,
                     end_ids: list[int]) -> Iterator[Opened]:
    large = _large(config)
    spec = config.models[large]
    with VllmServe(large, _path(spec), list(range(cores)), dtype=resolve_dtype(spec, on_gpu=False),
                   max_num_seqs=clients, max_model_len=_max_model_len(config)) as server:
        # entry = large: vLLM reports no share, so every token is counted as the large model's
        yield (lambda: OpenAITarget(server.url, large, model=large, entry=large,
                                    extra_body={"stop_token_ids": end_ids})), {}


def _total(samples: prometheus.Samples, name: str) -> float:
    return sum(value for (metric, _), value in samples.items() if metric == name)


def call_split(before: prometheus.Samples, after: prometheus.Samples, client: dict[str, Any]) -> dict[str, Any]:
    """One model's calls in one run: per call, the client's time against the server's own account
    (queue, prefill = the model's compute for the call's one token, the rest of the server's time) and
    what the client's time has beyond the server's (HTTP, the API server's parsing and detokenizing)."""
    def delta(name: str) -> float:
        return _total(after, name) - _total(before, name)

    calls = delta("vllm:e2e_request_latency_seconds_count")
    if not calls:
        return {}
    per_call = {h.removeprefix("vllm:").removesuffix("_seconds"): 1e3 * delta(f"{h}_sum") / calls for h in HISTOGRAMS}
    queries = delta("vllm:prefix_cache_queries_total")
    return {"calls": calls, "client_ms": client["client_ms_per_call"], **{f"{k}_ms": v for k, v in per_call.items()},
            "outside_engine_ms": client["client_ms_per_call"] - per_call["e2e_request_latency"],
            "context_tokens": delta("vllm:prompt_tokens_total") / calls,
            "computed_tokens": (queries - delta("vllm:prefix_cache_hits_total")) / calls,
            "prefix_hit_rate": delta("vllm:prefix_cache_hits_total") / queries if queries else None}


def run_serving(config: TokenRouterConfig, prompts: Sequence[str], end_ids: list[int], clients: Sequence[int],
                workload: Workload, timing: Timing, *, reps: int, cores: int, systems: Sequence[str] = SYSTEMS,
                seed: int = 0, progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """``progress`` gets the result so far after every run (a long run on a shared machine keeps what it has)."""
    if config.tokenizer_path is None:
        raise ValueError("the config names no tokenizer")
    codec = TextCodec.from_path(config.tokenizer_path, chat_template=False)  # the prompts are rendered already
    top = max(clients)
    openers: dict[str, Opener] = {"tokenrouter": lambda: tokenrouter_openai(config),
                                  "std_serving": lambda: std_serving_vllm(config, top, codec, end_ids),
                                  "large_alone": lambda: large_alone_vllm(config, top, cores, end_ids)}
    source = ListedPrompts(prompts)
    runs: list[dict[str, Any]] = []
    names = list(systems)
    for rep in range(reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            print(f"rep {rep}: starting {name}", file=sys.stderr, flush=True)
            with openers[name]() as (make_target, servers):
                warm = make_target()
                warm.generate(prompts[0], max_tokens=4, seed=0, deadline=float("inf"))  # first steps are cold
                warm.close()
                for n in clients:
                    runs.append(_one_run(name, rep, n, make_target(), workload, source, timing, seed,
                                         servers))
                    r = runs[-1]
                    print(f"  rep {rep} {name} N={n}: {r['throughput']:.1f} tok/s, TTFT {fmt(ms(r['ttft_median_s']))}"
                          f" ms, large share {pct(r['large_share'])}, errors {r['errors']}", file=sys.stderr,
                          flush=True)
                    if progress:
                        progress(_result(config, clients, names, reps, workload, timing, runs))
    return _result(config, clients, names, reps, workload, timing, runs)


def _result(config: TokenRouterConfig, clients: Sequence[int], names: list[str], reps: int, workload: Workload,
            timing: Timing, runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"suite": "vllm-serving", "config": config.model_dump(mode="json"), "clients": list(clients),
            "systems": names, "reps": reps, "workload": workload.__dict__, "timing": timing.__dict__,
            "dtypes": {n: resolve_dtype(s, on_gpu=False) for n, s in config.models.items()}, "runs": runs,
            "points": medians(runs, names, clients)}


def _one_run(name: str, rep: int, clients: int, target: Target, workload: Workload, source: ListedPrompts,
             timing: Timing, seed: int, servers: dict[str, VllmServe]) -> dict[str, Any]:
    before = {n: s.metrics() for n, s in servers.items()}
    result = closed_loop(target, workload, source, clients=clients, timing=timing, seed=seed + rep)
    row = {"system": name, "rep": rep, "clients": clients,
           **summarize(result.records, result.window, clients, large=target.large, steps=result.spans).as_dict(),
           "error_samples": sorted({str(r.error) for r in result.records if r.finish_reason == "error"})[:3]}
    if isinstance(target, VllmStdServingTarget):
        report = target.call_report()
        row["calls"] = {n: call_split(before[n], s.metrics(), report[n]) for n, s in servers.items() if n in report}
    return row


def medians(runs: list[dict[str, Any]], systems: Sequence[str], clients: Sequence[int]) -> list[dict[str, Any]]:
    keys = ("throughput", "ttft_median_s", "latency_median_s", "per_user_median_tok_s", "large_share")
    points = []
    for n in clients:
        for name in systems:
            rows = [r for r in runs if r["system"] == name and r["clients"] == n]
            point: dict[str, Any] = {"system": name, "clients": n, "throughput_all": [r["throughput"] for r in rows],
                                     "errors": sum(r["errors"] for r in rows)}
            for key in keys:
                present = [r[key] for r in rows if r[key] is not None]
                point[key] = statistics.median(present) if present else None
            # each engine's busy share of the window (TokenRouter's, read off its server's metrics port)
            point["busy"] = {model: statistics.median(r["busy"][model] for r in rows if model in r["busy"])
                             for model in sorted({m for r in rows for m in r.get("busy", {})})}
            calls = [r["calls"] for r in rows if r.get("calls")]
            if calls:
                point["calls"] = {model: {k: statistics.median(c[model][k] for c in calls if c.get(model))
                                          for k in calls[0][model] if calls[0][model][k] is not None}
                                  for model in calls[0]}
            points.append(point)
    return points


def report(result: dict[str, Any]) -> str:
    rows = []
    for p in result["points"]:
        base = next(q for q in result["points"] if q["system"] == "large_alone" and q["clients"] == p["clients"]) \
            if "large_alone" in result["systems"] else None
        ratio = p["throughput"] / base["throughput"] if p["throughput"] and base and base["throughput"] else None
        rows.append([p["clients"], LABELS[p["system"]], p["throughput"], ", ".join(f"{x:.1f}" for x in
                     p["throughput_all"]), ms(p["ttft_median_s"]), ms(p["latency_median_s"]),
                     p["per_user_median_tok_s"], pct(p["large_share"]),
                     ", ".join(f"{model} {pct(share)}" for model, share in p.get("busy", {}).items()) or "-",
                     ratio, p["errors"]])
    out = [table(["N", "system", "tokens/s (median)", "per rep", "TTFT ms", "latency ms", "per-user tok/s",
                  "large share", "engines busy", "/ large alone", "errors"], rows)]
    split = [[p["clients"], model, c.get("calls"), c.get("client_ms"), c.get("request_queue_time_ms"),
              c.get("request_prefill_time_ms"), c.get("e2e_request_latency_ms"), c.get("outside_engine_ms"),
              c.get("context_tokens"), c.get("computed_tokens")]
             for p in result["points"] for model, c in p.get("calls", {}).items()]
    if split:
        out += ["", "Std. Serving, per one-token call (medians over reps):", "",
                table(["N", "model", "calls", "client ms", "queue ms", "prefill (compute) ms", "server e2e ms",
                       "outside the engine ms", "context tokens", "tokens computed"], split)]
    return "\n".join(out)
