"""The device check's routed parts: TokenRouter's runtime on the device's engines, its greedy output
against the naive reference, and its speed against the large model alone.

The runtime is wired here from its pydantic-free pieces (subserver cores, the in-process transport,
the tokenrouter strategy), with a policy written against ``tokenrouter.protocol.Policy`` alone: the
config layer and the shipped policies need pydantic, which a bare torch machine may not have. What
is checked is the part a device changes: engines stepped from the subservers' threads, requests
going pending on one model and resuming with the other's tokens.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from typing import Any, Callable, ClassVar, Sequence

import torch

from tokenrouter.engine.base import Engine
from tokenrouter.engine.loader import transformers_attention
from tokenrouter.protocol import PeerMessage, RequestSpec, RequestView, Route
from tokenrouter.runtime.core import Limits, SubserverCore
from tokenrouter.runtime.reference import FullRecompute, reference_generate
from tokenrouter.runtime.strategies import make_strategy
from tokenrouter.runtime.subserver import Subserver
from tokenrouter.runtime.transport import InProcessTransport

from tokenrouter_tools.gpu_check_common import median

MODELS = ("slm", "llm")  # entry (small) first
WAIT_S = 180.0  # a request's output, at the latest (a hang is reported, not waited out)


class PositionDeferral:
    """The small model decodes; a position whose hash falls under ``rate`` goes to the large model,
    which writes ``run_length`` tokens and hands back. Decisions depend only on (seed, position), so
    batching cannot change the routed output; the small model's token at a deferred position is
    dropped (the large one regenerates it), as the shipped deferral policies do."""

    name: ClassVar[str] = "gpu_check_deferral"
    needs_hidden = False
    top_logits = 0
    needs_logits = False  # decisions read positions only: a tensor-parallel large model sends back tokens alone

    def __init__(self, rate: float, run_length: int = 2, seed: int = 0) -> None:
        self.rate, self.run_length, self.seed = rate, run_length, seed

    def defer(self, position: int) -> bool:
        digest = hashlib.blake2b(repr((self.seed, position)).encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") / 2**64 < self.rate

    def route(self, batch: Sequence[RequestView], out: Any) -> list[str | Route]:
        small, large = MODELS
        decisions: list[str | Route] = []
        for request in batch:
            if request.model == small:
                decisions.append(large if self.defer(len(request.token_ids)) else small)
                continue
            count = request.state.get("large_tokens", 0) + 1
            decisions.append(Route(small if count >= self.run_length else large, state={"large_tokens": count}))
        return decisions

    def send(self, request: RequestView, peer: str) -> PeerMessage:
        if peer == MODELS[1]:
            return request.message_to(peer, keep_sampled=False, state={"large_tokens": 0})
        return request.message_to(peer, keep_sampled=True, state={})

    def receive(self, request: RequestView, message: PeerMessage) -> list[int]:
        return list(message.tokens)


class Output:
    """One request's output (a ClientSink)."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.origins: list[int] = []
        self.reason: str | None = None
        self.error: str | None = None
        self.done = threading.Event()

    def on_output(self, tokens: list[int], origins: list[int], finish_reason: str | None = None,
                  error: str | None = None, logprobs: list[float] | None = None) -> None:
        self.tokens.extend(tokens)
        self.origins.extend(origins)
        if finish_reason is not None:
            self.reason, self.error = finish_reason, error
            self.done.set()


class Runtime:
    """Subservers over ``engines`` ({model name: engine}, entry first), one thread each, joined in process."""

    def __init__(self, engines: dict[str, Engine], policy: Any, *, max_active: int) -> None:
        names = list(engines)
        self.entry = names[0]
        self.max_model_len = min(engine.max_model_len for engine in engines.values())
        capacities = {name: (engine.num_total_blocks, engine.block_size) for name, engine in engines.items()}
        self.transport = InProcessTransport()
        strategy = make_strategy("tokenrouter", len(names))
        self.servers: dict[str, Subserver] = {}
        for name, engine in engines.items():
            limits = Limits(max_batch_size=max_active, max_prefill_tokens=4096, max_wait_s=0.02,
                            max_model_len=self.max_model_len, max_active=max_active, max_queue=4 * max_active,
                            queue_timeout_s=0.0, max_bypass=8)
            core = SubserverCore(name, names, self.entry, policy, limits,
                                 capacities=capacities if name == self.entry else None)
            self.servers[name] = server = Subserver(core, engine, self.transport, strategy)
            self.transport.connect(name, server.deliver)
        for server in self.servers.values():
            server.start()
        self._ids = 0

    def generate(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> list[Output]:
        outputs = []
        for prompt_ids in prompts:
            output = Output()
            spec = RequestSpec(prompt_len=len(prompt_ids), max_tokens=max_tokens, end_ids=[])
            self.servers[self.entry].submit(f"req-{self._ids}", list(prompt_ids), spec, output)
            self._ids += 1
            outputs.append(output)
        for output in outputs:
            if not output.done.wait(WAIT_S):
                raise TimeoutError(f"a routed request did not finish within {WAIT_S:.0f} s")
            if output.reason == "error":
                raise RuntimeError(f"a routed request failed: {output.error}")
        return outputs

    def close(self) -> None:
        for server in self.servers.values():
            server.stop()
        self.transport.close()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def full_recompute(model: Any) -> FullRecompute:
    """The reference's model: next-token logits and last hidden state of a whole context, no cache,
    computed on the model's own device."""
    device = next(model.parameters()).device

    @torch.inference_mode()
    def forward(tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        output = model(torch.tensor([tokens], device=device), use_cache=False, output_hidden_states=True)
        return output.logits[0, -1].float().cpu(), output.hidden_states[-1][0, -1].float().cpu()

    return forward


def routed_equals_reference(engines: dict[str, Engine], models: dict[str, Any], prompts: list[list[int]],
                            max_tokens: int, rate: float) -> dict[str, Any]:
    """Greedy routed output of every prompt (run concurrently) equals the naive reference token for
    token, model for model; every KV block is back afterwards."""
    with Runtime(engines, PositionDeferral(rate), max_active=len(prompts)) as runtime:
        outputs = runtime.generate(prompts, max_tokens)
        max_model_len = runtime.max_model_len
    references = {name: full_recompute(model) for name, model in models.items()}
    equal, routed_tokens = 0, 0
    with contextlib.ExitStack() as stack:  # the models may be a torch engine's: transformers' attention back
        for model in models.values():
            stack.enter_context(transformers_attention(model))
        for prompt_ids, output in zip(prompts, outputs):
            spec = RequestSpec(prompt_len=len(prompt_ids), max_tokens=max_tokens, end_ids=[])
            tokens, origins, reason = reference_generate(references, PositionDeferral(rate), MODELS[0], prompt_ids,
                                                         spec, max_model_len=max_model_len)
            equal += (output.tokens, output.origins, output.reason) == (tokens, origins, reason)
            routed_tokens += sum(origin != 0 for origin in output.origins)
    blocks_back = all(engine.num_free_blocks == engine.num_total_blocks for engine in engines.values())
    return {"passed": equal == len(prompts) and blocks_back and routed_tokens > 0,
            "requests_equal": f"{equal}/{len(prompts)}", "large_model_tokens": routed_tokens,
            "kv_blocks_all_free_after": blocks_back}


def routed_vs_large_alone(engines: dict[str, Engine], large_alone: Callable[[list[list[int]], int], Any],
                          prompts_for: Callable[[int], list[list[int]]], clients: Sequence[int], max_tokens: int,
                          rate: float, reps: int) -> dict[str, Any]:
    """Output tokens per second: N requests through TokenRouter (small entry; ``rate`` of positions
    written by the large model, one token per visit) against the large model alone on the same
    prompts, alternated rep by rep."""
    report: dict[str, Any] = {}
    with Runtime(engines, PositionDeferral(rate, run_length=1), max_active=max(clients)) as runtime:
        runtime.generate(prompts_for(2), 4)  # warm-up: kernels, allocator
        large_alone(prompts_for(2), 4)
        for n in clients:
            prompts = prompts_for(n)
            times: dict[str, list[float]] = {"tokenrouter": [], "large_alone": []}
            share = 0.0
            for rep in range(reps):
                runs = [("tokenrouter", lambda: runtime.generate(prompts, max_tokens)),
                        ("large_alone", lambda: large_alone(prompts, max_tokens))]
                for name, run in runs if rep % 2 == 0 else runs[::-1]:
                    start = time.perf_counter()
                    result = run()
                    times[name].append(time.perf_counter() - start)
                    if name == "tokenrouter":
                        origins = [o for output in result for o in output.origins]
                        share = sum(o != 0 for o in origins) / len(origins)
            tokens = n * max_tokens
            routed, alone = median(times["tokenrouter"]), median(times["large_alone"])
            report[f"n_{n}"] = {"tokenrouter_tok_s": round(tokens / routed, 1),
                                "large_alone_tok_s": round(tokens / alone, 1),
                                "speedup": round(alone / routed, 3), "large_model_share": round(share, 3),
                                "seconds": {name: [round(t, 3) for t in values] for name, values in times.items()}}
    return report
