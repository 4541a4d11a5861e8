"""Std. Serving as a user builds it on vLLM: one `vllm serve` per model and a dispatcher that asks the
current model's OpenAI completions API for one token per call, the whole context as token ids, with
the top-20 log-probabilities, and runs the routing policy between calls.

The dispatcher is ``stdserving.dispatch`` (the per-request routing loop of ``reference_generate``), so
the decisions are the policy object's own. A call's answer becomes next-token logits that hold the
returned top-20 log-probabilities and -inf elsewhere: the greedy token is the server's, and a policy
that reads only the sampled token or its seed (``random``) decides exactly as in TokenRouter. A
policy that reads the whole distribution (R-Stitch's entropy) sees only its top 20 here.

Each call is timed on the client (``CallLog``) so its cost can be split against the servers' own
``/metrics`` (queue, prefill = model compute of the call, the rest: HTTP, API server, scheduling).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tokenrouter.policies.base import RoutingPolicy
from tokenrouter.text import TextCodec

from .records import Prompt, RequestRecord
from .stdserving import dispatch
from .targets import PerThread, Spans
from .vllm_serve import MAX_LOGPROBS

CALL_TIMEOUT_S = 600.0
TOKEN_ID_PREFIX = "token_id:"  # return_tokens_as_token_ids spells each top token so


@dataclass
class CallLog:
    """Per model: client-side seconds of every one-token call, and how many context tokens it sent."""

    seconds: dict[str, list[float]] = field(default_factory=dict)
    context_tokens: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, model: str, seconds: float, tokens: int) -> None:
        with self._lock:
            self.seconds.setdefault(model, []).append(seconds)
            self.context_tokens[model] = self.context_tokens.get(model, 0) + tokens


def top_logprobs_as_logits(top: dict[str, float], vocab_size: int) -> torch.Tensor:
    """vLLM's top log-probabilities of one position (keys ``token_id:N``) as logits [vocab]: the
    returned values, -inf for every other token."""
    logits = torch.full((vocab_size,), float("-inf"))
    for key, logprob in top.items():
        if not key.startswith(TOKEN_ID_PREFIX):
            raise ValueError(f"top_logprobs key {key!r} is not a token id (return_tokens_as_token_ids off?)")
        logits[int(key[len(TOKEN_ID_PREFIX):])] = logprob
    return logits


class CompletionsModel:
    """One model behind a vLLM OpenAI server as a full-recompute function: each call POSTs the whole
    context to /v1/completions for one greedy token (one kept HTTP connection per client thread)."""

    def __init__(self, url: str, name: str, vocab_size: int, calls: CallLog) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.name, self.vocab_size, self.calls = name, vocab_size, calls
        self._connections = PerThread(lambda: http.client.HTTPConnection(host, int(port), timeout=CALL_TIMEOUT_S))

    def __call__(self, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        body = json.dumps({"model": self.name, "prompt": tokens, "max_tokens": 1, "temperature": 0,
                           "logprobs": MAX_LOGPROBS, "return_tokens_as_token_ids": True})
        connection = self._connections.get()
        start = time.monotonic()
        try:
            status, payload = _post(connection, body)
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            # the server closed the kept connection while it sat idle (uvicorn's keep-alive timeout):
            # open it again and send once more, as any pooled HTTP client does
            connection.close()
            status, payload = _post(connection, body)
        self.calls.add(self.name, time.monotonic() - start, len(tokens))
        if status != 200:
            raise RuntimeError(f"'{self.name}' answered {status}: {payload.decode(errors='replace')[:300]}")
        logprobs = json.loads(payload)["choices"][0]["logprobs"]
        return top_logprobs_as_logits(logprobs["top_logprobs"][0], self.vocab_size), torch.empty(0)

    def close(self) -> None:
        self._connections.close()


def _post(connection: http.client.HTTPConnection, body: str) -> tuple[int, bytes]:
    connection.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    reply = connection.getresponse()
    return reply.status, reply.read()


def vocab_size(model_path: Path) -> int:
    return int(json.loads((Path(model_path) / "config.json").read_text())["vocab_size"])


class VllmStdServingTarget:
    """The dispatcher on the client's thread, over one vLLM OpenAI server per model."""

    def __init__(self, urls: dict[str, str], policy: RoutingPolicy, *, large: str, vocab: int, codec: TextCodec | None,
                 end_ids: list[int], max_model_len: int) -> None:
        if policy.needs_hidden:
            raise ValueError(f"policy '{policy.name}' reads hidden states; a completions API returns none")
        self.policy, self.large, self.codec, self.end_ids, self.max_model_len = policy, large, codec, end_ids, \
            max_model_len
        self.calls = CallLog()
        self.models = {name: CompletionsModel(url, name, vocab, self.calls) for name, url in urls.items()}

    def generate(self, prompt: Prompt, *, max_tokens: int, seed: int, deadline: float) -> RequestRecord:
        return dispatch(dict(self.models), self.policy, self.policy.entry, prompt, codec=self.codec,
                        end_ids=self.end_ids, max_model_len=self.max_model_len, max_tokens=max_tokens, seed=seed,
                        deadline=deadline)

    def step_spans(self) -> Spans:
        return {}  # the engines step inside the vLLM servers; their /metrics tell the split

    def call_report(self) -> dict[str, Any]:
        return {name: {"calls": len(s), "client_ms_per_call": 1e3 * sum(s) / max(len(s), 1),
                       "context_tokens_per_call": self.calls.context_tokens[name] / max(len(s), 1)}
                for name, s in self.calls.seconds.items()}

    def close(self) -> None:
        for model in self.models.values():
            model.close()
