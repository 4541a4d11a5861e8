"""A served TokenRouter through its OpenAI-compatible server as a benchmark target: streamed
/v1/completions (SSE), the same load as the gRPC target (the prompt as it is, greedy, the request's
seed, its max_tokens).

Each client thread keeps one HTTP connection open (keep-alive, as an OpenAI client does) and sends
its requests on it one after another. Token counts per event come from vLLM's
``stream_options.continuous_usage_stats`` (the usage so far in every chunk); each event is stamped
when its line reaches the client. The large model's tokens are its share of the request's output
(``large_model_share`` of the last chunk).

A request still streaming at the deadline (the end of the measuring window) is cut there: the
client closes its connection, which cancels the request in the server, as a user who goes away
does; tokens after the window are not counted anyway, and waiting for them took minutes at low
token rates. A cut request's tokens stay unattributed (the share comes with the last chunk), so the
large share is over the requests that ended. Given the Triton server's metrics port, it reads the
engines' busy time while it runs (``busy_sampler``).
"""

from __future__ import annotations

import http.client
import json
import time
from typing import Sequence
from urllib.parse import urlsplit

from tokenrouter import client

from .busy_sampler import BusySampler
from .records import Prompt, RequestRecord
from .targets import PerThread, Spans

RESPONSE_TIMEOUT_S = 600.0


class OpenAITarget:
    def __init__(self, url: str, large: str, model: str = client.DEFAULT_MODEL, entry: str = "entry",
                 extra_body: dict | None = None, metrics_urls: Sequence[str] = ()) -> None:
        """``extra_body``: more request fields (NVIDIA Dynamo's frontend: ``nvext``, for engine_data);
        ``metrics_urls``: the Triton servers whose engines' busy time to read."""
        self.extra_body = extra_body or {}
        self._busy = BusySampler(metrics_urls)
        parts = urlsplit(url)
        if parts.hostname is None:
            raise ValueError(f"the OpenAI server's URL names no host: {url!r}")
        self.host, self.port, self.large, self.model, self.entry = parts.hostname, parts.port, large, model, entry
        self._connections = PerThread(lambda: http.client.HTTPConnection(self.host, self.port,
                                                                         timeout=RESPONSE_TIMEOUT_S))

    def generate(self, prompt: Prompt, *, max_tokens: int, seed: int, deadline: float) -> RequestRecord:
        if not isinstance(prompt, str):
            raise TypeError("the OpenAI server takes text prompts")
        body = json.dumps({"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "seed": seed,
                           "temperature": 0, "stream": True,
                           "stream_options": {"include_usage": True, "continuous_usage_stats": True},
                           **self.extra_body})
        record = RequestRecord()
        connection = self._connections.get()
        connection.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        reply = connection.getresponse()
        if reply.status != 200:
            record.finish("error", "", reply.read().decode(errors="replace"))
            return record
        text: list[str] = []
        counted, reason, share, cut = 0, None, 0.0, False
        for line in reply:
            if not line.startswith(b"data: "):
                continue
            if line.startswith(b"data: [DONE]"):
                break
            chunk = json.loads(line[6:])
            if "error" in chunk:
                record.finish("error", "".join(text), chunk["error"]["message"])
                reply.read()
                return record
            usage = chunk.get("usage")
            if usage:  # tokens so far: what this event added
                record.add(usage["completion_tokens"] - counted, at=time.monotonic())
                counted = usage["completion_tokens"]
            for choice in chunk["choices"]:
                text.append(choice["text"])
                reason = choice.get("finish_reason") or reason  # Dynamo leaves out a null one
                share = choice.get("large_model_share", share)
            # Dynamo's frontend: the engine's last chunk's engine_data
            share = chunk.get("nvext", {}).get("engine_data", {}).get("large_model_share", share)
            if time.monotonic() >= deadline and not reason:
                reason, cut = "cancelled", True
                break
        if cut:
            connection.close()  # the next request opens a new one
        else:
            reply.read()  # to its end: the connection is reused
            large = round(share * counted)
            record.tokens_by_model.update({self.large: large, self.entry: counted - large})
        record.finish(reason or "error", "".join(text))
        return record

    def step_spans(self) -> Spans:
        return self._busy.spans()

    def close(self) -> None:
        self._connections.close()
        self._busy.close()
