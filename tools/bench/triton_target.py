"""A served TokenRouter as a benchmark target: a front over gRPC streaming (tokenrouter.client).

Each client thread keeps one gRPC stream open (as a streaming client would) and sends its
requests on it one after another. Tokens are stamped in the stream's callback, when the response
reaches the client. A request still running at the deadline runs to its end; the window
accounting ignores tokens after the deadline. Given the servers' metrics ports, it reads their
engines' busy time while it runs (``busy_sampler``), for the same busy shares an embedded run reports.
"""

from __future__ import annotations

import itertools
from typing import Sequence

from tokenrouter import client

from .busy_sampler import BusySampler
from .records import Prompt, RequestRecord
from .targets import PerThread, Spans

RESPONSE_TIMEOUT_S = 600.0
# What the benchmark reads, and so asks for, as a client asks TensorRT-LLM's ensemble for text_output:
# every output left out is a tensor fewer per response in each process it would cross.
READ_OUTPUTS = ("text_output", "output_models", "finish_reason")


class TritonTarget:
    def __init__(self, url: str, large: str, model: str = client.DEFAULT_MODEL,
                 metrics_urls: Sequence[str] = ()) -> None:
        self.url, self.large, self.model = url, large, model
        self._busy = BusySampler(metrics_urls)
        self._streams = PerThread(lambda: client.GrpcStream(url))
        self._ids = itertools.count()

    def generate(self, prompt: Prompt, *, max_tokens: int, seed: int, deadline: float) -> RequestRecord:
        if not isinstance(prompt, str):
            raise TypeError("the served fronts take text prompts")
        stream = self._streams.get()
        stream.send(client.inputs(text_input=prompt, max_tokens=max_tokens, seed=seed, stream=True), self.model,
                    request_id=str(next(self._ids)), outputs=READ_OUTPUTS)
        record = RequestRecord()
        text, reason = [], None
        try:
            for reply in stream.replies(RESPONSE_TIMEOUT_S):
                if reply.outputs:
                    record.add(len(reply.models), reply.models, at=reply.at)
                    text.append(reply.text)
                    reason = reply.finish_reason or reason
        except client.InferenceServerException as error:
            record.finish("error", "".join(text), str(error))
            return record
        record.finish(reason or "error", "".join(text))
        return record

    def step_spans(self) -> Spans:
        return self._busy.spans()

    def close(self) -> None:
        self._streams.close()
        self._busy.close()
