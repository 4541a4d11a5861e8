"""The embedded Python API: every subserver in this process, joined by the in-process transport.

    from tokenrouter import TokenRouter

    with TokenRouter.from_config("configs/tiny.yaml") as router:
        for result in router.generate(["def add(a, b):"], max_tokens=32):
            print(result.text, result.large_model_share)
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Sequence

from ..config import TokenRouterConfig, load_config
from ..engine.base import Engine
from ..engine.factory import create_engine
from ..text import TextCodec
from .assembly import build_policy, build_subserver, effective_max_model_len, make_auto_thresholds
from ..request_builder import DEFAULT_MAX_TOKENS, RequestError, build_spec
from .admission import ServerBusy
from .emission import large_model_share
from .observers import StepLog
from .strategies import make_strategy
from .subserver import Subserver
from .transport import InProcessTransport

Prompt = str | Sequence[int]
NOT_A_PROMPT = "a prompt must be a string or a sequence of int token ids"


class GenerationError(RuntimeError):
    """A request ended with an error (its message says why)."""


@dataclass
class GenerationResult:
    token_ids: list[int]
    models: list[str]  # the model that produced each output token
    finish_reason: str
    large_model_share: float  # share of output tokens produced by models other than the entry
    text: str | None = None  # None when the engine has no tokenizer (token-id prompts)
    error: str | None = None
    logprobs: list[float] | None = None  # per output token, when the request asked (return_log_probs)


@dataclass
class GenerationChunk:
    token_ids: list[int]
    models: list[str]
    text: str | None
    finish_reason: str | None = None
    logprobs: list[float] | None = None  # per token, when the request asked (return_log_probs)


class RequestHandle:
    """One request's output as it arrives (a ClientSink fed by the entry's loop thread)."""

    def __init__(self, rid: str, router: "TokenRouter") -> None:
        self.rid = rid
        self._router = router
        self.token_ids: list[int] = []
        self.origins: list[int] = []
        self.logprobs: list[float] | None = None  # set by the first output when the request returns them
        self.finish_reason: str | None = None
        self.error: str | None = None
        self._done = threading.Event()
        self._listeners: list[Any] = []
        self._lock = threading.Lock()

    # ClientSink
    def on_output(self, tokens: list[int], origins: list[int], finish_reason: str | None = None,
                  error: str | None = None, logprobs: list[float] | None = None) -> None:
        with self._lock:
            self.token_ids.extend(tokens)
            self.origins.extend(origins)
            if logprobs is not None:
                self.logprobs = (self.logprobs or []) + list(logprobs)
            if finish_reason is not None:
                self.finish_reason, self.error = finish_reason, error
                self._done.set()
            listeners = list(self._listeners)
        for listener in listeners:
            listener()

    def since(self, start: int) -> tuple[list[int], list[int], list[float] | None, str | None, str | None]:
        """Output from token ``start`` on, read together: tokens, origins, log probabilities (None when
        the request returns none), finish reason and error (None while it runs)."""
        with self._lock:
            logprobs = None if self.logprobs is None else self.logprobs[start:len(self.token_ids)]
            return self.token_ids[start:], self.origins[start:], logprobs, self.finish_reason, self.error

    def add_listener(self, listener) -> None:
        with self._lock:
            self._listeners.append(listener)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def cancel(self) -> None:
        self._router.cancel(self)

    def wait(self, timeout: float | None = None) -> GenerationResult:
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.rid} did not finish within {timeout} s")
        return self._router._result(self)


class TokenRouter:
    """All models of a config, served in this process."""

    def __init__(self, config: TokenRouterConfig, engines: dict[str, Engine] | None = None,
                 codec: TextCodec | None = None, *, step_log: int = 0) -> None:
        """``step_log``: keep each subserver's last that many step records (``subserver.step_log``;
        for benchmarks and tests); 0 keeps none."""
        self.config = config
        names = config.model_names
        self._owns_engines = engines is None  # engines passed in stay open for their owner to reuse
        self.engines = engines or {name: create_engine(name, config.models[name]) for name in names}
        if codec is None and config.tokenizer_path and config.models[config.entry].engine != "simulated":
            codec = TextCodec.from_path(config.tokenizer_path, chat_template=config.chat_template)
        self.codec = codec
        self.max_model_len = effective_max_model_len(config, [e.max_model_len for e in self.engines.values()])
        self.transport = InProcessTransport()
        self.strategy = make_strategy(config.scheduling.strategy, len(names))
        self.auto = make_auto_thresholds(config)
        capacities = {name: (e.num_total_blocks, e.block_size) for name, e in self.engines.items()}
        self.policy = build_policy(config)
        self.subservers: dict[str, Subserver] = {}
        for name in names:
            observers = [StepLog(step_log)] if step_log else []
            server = build_subserver(config, name, self.engines[name], self.policy, self.transport, self.strategy,
                                     max_model_len=self.max_model_len, auto=self.auto, capacities=capacities,
                                     observers=observers)
            self.transport.connect(name, server.deliver)
            self.subservers[name] = server
        self.entry = self.subservers[config.entry]
        self._ids = itertools.count()
        self._closed = False
        for server in self.subservers.values():
            server.start()

    @classmethod
    def from_config(cls, source: str | Path | dict[str, Any] | TokenRouterConfig, **kwargs: Any) -> "TokenRouter":
        return cls(load_config(source), **kwargs)

    # --- requests --------------------------------------------------------------------------------
    def submit(self, prompt: Prompt, *, max_tokens: int = DEFAULT_MAX_TOKENS, temperature: float = 0.0,
               top_p: float = 1.0, top_k: int = 0, seed: int = 0, stop: Sequence[str] = (),
               bad_words: Sequence[str] = (), repetition_penalty: float = 1.0, presence_penalty: float = 0.0,
               frequency_penalty: float = 0.0, min_tokens: int = 0, logit_bias: Sequence[tuple[int, float]] = (),
               return_log_probs: bool = False, stop_token_ids: Sequence[int] = (),
               ignore_eos: bool = False) -> RequestHandle:
        """Start one request; returns at once. Raises RequestError for bad input and ServerBusy
        when ``scheduling.max_queue`` requests already wait for admission. The sampling keywords
        are TensorRT-LLM's (docs/engine.md, "Sampling"); their defaults are RequestSpec's, greedy.
        ``stop_token_ids`` are more end ids (``min_tokens`` holds them off too, as vLLM's); ``ignore_eos``
        drops the model's end ids."""
        if self._closed:
            raise RuntimeError("the engine is shut down")
        prompt_ids = self._encode(prompt)
        eos = self.engines[self.config.entry].eos_token_ids
        end_ids = [] if ignore_eos else self.codec.end_ids(eos) if self.codec else sorted(eos)
        end_ids += [int(t) for t in stop_token_ids if int(t) not in end_ids]
        sent = dict(max_tokens=int(max_tokens), temperature=float(temperature), top_p=float(top_p), top_k=int(top_k),
                    seed=int(seed), repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
                    frequency_penalty=frequency_penalty, min_tokens=min_tokens, return_log_probs=return_log_probs)
        spec = build_spec(len(prompt_ids), sent, end_ids=end_ids, stop_sequences=self._sequences(stop),
                          bad_sequences=self._sequences(bad_words), logit_bias=logit_bias)
        handle = RequestHandle(f"req-{next(self._ids)}", self)
        self.entry.submit(handle.rid, prompt_ids, spec, handle)
        return handle

    def generate(self, prompts: Prompt | Sequence[Prompt], *, max_tokens: int = DEFAULT_MAX_TOKENS,
                 temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int | Sequence[int] = 0,
                 stop: Sequence[str] = (), bad_words: Sequence[str] = (), timeout: float | None = None,
                 **sampling: Any) -> list[GenerationResult]:
        """Generate for every prompt concurrently; a request that fails has finish_reason 'error'.
        A batch larger than the admission queue is fed in as its own earlier requests finish.
        ``sampling``: the other keywords of ``submit`` (penalties, min_tokens, logit_bias, return_log_probs)."""
        batch = _as_batch(prompts)
        seeds = [seed] * len(batch) if isinstance(seed, int) else list(seed)
        if len(seeds) != len(batch):
            raise ValueError(f"got {len(seeds)} seeds for {len(batch)} prompts")
        handles: list[RequestHandle] = []
        for p, s in zip(batch, seeds):
            while True:
                try:
                    handles.append(self.submit(p, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                               top_k=top_k, seed=s, stop=stop, bad_words=bad_words, **sampling))
                    break
                except ServerBusy:
                    oldest = next((h for h in handles if not h.done), None)
                    if oldest is None:  # the queue is full of other callers' requests
                        raise
                    oldest.wait(timeout)
        return [handle.wait(timeout) for handle in handles]

    async def stream(self, prompt: Prompt, *, pace: Callable[[], float] | None = None, text: bool = True,
                     **kwargs: Any) -> AsyncIterator[GenerationChunk]:
        """Yield chunks as tokens are committed; cancelling the consumer cancels the request.

        ``pace``: the seconds a chunk should follow the one before (asked after each). Tokens committed
        meanwhile leave together in the next chunk, and no wake-up reaches the consumer for them; the
        first chunk and the last are never held. A consumer whose every chunk costs the same however
        many tokens it carries (a message through another process) thus pays per interval, not per
        token. ``text=False``: chunks carry no text (a consumer that detokenizes itself)."""
        loop = asyncio.get_running_loop()
        wakeup, release = asyncio.Event(), asyncio.Event()
        handle = self.submit(prompt, **kwargs)
        codec = self.codec if text else None
        waiting = True  # False while a paced chunk is held back: only the end wakes the consumer then

        def ended() -> None:
            wakeup.set()
            release.set()

        def wake() -> None:  # on the entry's loop thread, after each output
            if not (waiting or handle.done):
                return
            try:
                loop.call_soon_threadsafe(ended if handle.done else wakeup.set)
            except RuntimeError:  # the consumer's loop is closed: it no longer wants output
                pass

        handle.add_listener(wake)
        wakeup.set()  # tokens may have arrived before the listener was added
        sent, text_sent, held = 0, "", False
        try:
            while True:
                if not held:
                    await wakeup.wait()
                wakeup.clear()
                held = False
                finished = handle.done
                with handle._lock:  # one output's tokens, origins and log probabilities together
                    tokens, origins, logprobs = handle.token_ids[:], handle.origins[:], handle.logprobs
                if len(tokens) > sent or finished:
                    decoded = codec.stable_text(tokens, finished) if codec else None
                    yield GenerationChunk(tokens[sent:], self._names(origins[sent:]),
                                          None if decoded is None else decoded[len(text_sent):],
                                          handle.finish_reason if finished else None,
                                          None if logprobs is None else logprobs[sent:len(tokens)])
                    sent, text_sent = len(tokens), decoded or ""
                    interval = 0.0 if finished or pace is None else pace()
                    if interval > 0:
                        waiting = False
                        release.clear()
                        timer = loop.call_later(interval, release.set)
                        if not handle.done:  # an end that came before ``waiting`` dropped has woken no one
                            await release.wait()
                        timer.cancel()
                        waiting, held = True, True  # read what came meanwhile without a wake-up
                if finished:
                    if handle.finish_reason == "error":
                        raise GenerationError(handle.error)
                    return
        finally:
            if not handle.done:
                self.cancel(handle)

    def cancel(self, handle: RequestHandle) -> None:
        self.entry.cancel(handle.rid)

    # --- introspection ---------------------------------------------------------------------------
    def kv_blocks_used(self) -> dict[str, int]:
        return {name: engine.num_used_blocks for name, engine in self.engines.items()}

    @property
    def alive(self) -> bool:
        """Every subserver's loop runs (False after shutdown, or when a loop died: its
        ``failure`` says why, and its requests ended with that error)."""
        return all(server.alive for server in self.subservers.values())

    def held_requests(self) -> dict[str, int]:
        """Requests each subserver still tracks (running or pending)."""
        return {name: len(server.requests) for name, server in self.subservers.items()}

    # --- lifecycle -------------------------------------------------------------------------------
    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for server in self.subservers.values():
            server.stop()
        self.transport.close()
        if self.auto is not None:
            self.auto.close()
        if self._owns_engines:
            for engine in self.engines.values():
                engine.close()

    def __enter__(self) -> "TokenRouter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # --- helpers ---------------------------------------------------------------------------------
    def _encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.codec is None:
                raise RequestError("this engine has no tokenizer: pass token ids")
            if not prompt:
                raise RequestError("the prompt is empty")
            return self.codec.encode_prompt(prompt)
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise RequestError(NOT_A_PROMPT)
        return list(prompt)

    def _sequences(self, words: Sequence[str]) -> list[list[int]]:
        if not words:
            return []
        if self.codec is None:
            raise RequestError("stop and bad words need a tokenizer; this engine has none")
        return self.codec.token_sequences(words)

    def _names(self, origins: Sequence[int]) -> list[str]:
        return [self.config.model_names[o] for o in origins]

    def _result(self, handle: RequestHandle) -> GenerationResult:
        models = self._names(handle.origins)
        share = large_model_share(Counter(handle.origins), self.config.model_names.index(self.config.entry))
        text = self.codec.decode(handle.token_ids) if self.codec else None
        return GenerationResult(handle.token_ids[:], models, handle.finish_reason or "error", share, text,
                                handle.error, None if handle.logprobs is None else handle.logprobs[:])


def _as_batch(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    """The prompts of a batch; one prompt (a string, or token ids) is a batch of one. Ints mixed with
    other prompts are neither: refused before any is submitted."""
    if isinstance(prompts, str):
        return [prompts]
    ids = [p for p in prompts if isinstance(p, int)]
    if ids and len(ids) < len(prompts):
        raise RequestError(NOT_A_PROMPT)
    return [ids] if ids else [p for p in prompts if not isinstance(p, int)]
