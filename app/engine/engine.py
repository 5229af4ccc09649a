"""The engine: one model, one lock, token ids in and token ids out.

Generation is serialized: a request holds the lock from its first prefill chunk
to its last decode step. The KV cache keeps what the previous request left in
it, so a prompt that starts with the same tokens prefills only the rest.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from .cancel import CancelToken
from .native import NativeError, NativeModel
from .offload import run_blocking
from .sampling import SamplingParams


class ContextLengthError(ValueError):
    """The prompt leaves no room in the context for even one new token."""

    def __init__(self, prompt_tokens: int, context_length: int):
        super().__init__(
            f"the prompt has {prompt_tokens} tokens, but this model's context holds {context_length}"
        )
        self.prompt_tokens = prompt_tokens
        self.context_length = context_length


@dataclass(frozen=True)
class GenerationRequest:
    prompt: list[int]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_token_ids: frozenset[int] = frozenset()


@dataclass(frozen=True)
class TokenEvent:
    token_id: int
    logprob: float


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None  # "stop", "length" or "cancelled"
    queued_ms: float = 0.0
    prompt_ms: float = 0.0
    decode_ms: float = 0.0


class Generation:
    """Iterate for TokenEvents; `stats` is complete once iteration ends."""

    def __init__(self, events: Iterator[TokenEvent], stats: GenerationStats):
        self._events = events
        self.stats = stats

    def __iter__(self) -> Iterator[TokenEvent]:
        return self._events

    def close(self) -> None:
        self._events.close()


class Engine:
    def __init__(
        self,
        model: NativeModel,
        *,
        prefill_chunk: int = 128,
        prefix_reuse: bool = True,
        offload: Callable = run_blocking,
    ):
        self.model = model
        self.context_length = model.info.max_seq_len
        self.prefill_chunk = max(1, min(prefill_chunk, model.info.max_prefill_len))
        self.prefix_reuse = prefix_reuse
        self._offload = offload
        self._lock = threading.Lock()
        self._kv_tokens: list[int] = []  # tokens whose keys/values fill positions 0..n-1
        self.generating = False
        self.requests_started = 0

    def check_fits(self, prompt_tokens: int) -> None:
        if prompt_tokens >= self.context_length:
            raise ContextLengthError(prompt_tokens, self.context_length)

    def generate(self, request: GenerationRequest, cancel: CancelToken | None = None) -> Generation:
        """Start a generation. Raises ContextLengthError before taking the lock."""
        if not request.prompt:
            raise ValueError("the prompt is empty")
        self.check_fits(len(request.prompt))
        stats = GenerationStats(prompt_tokens=len(request.prompt))
        return Generation(self._run(request, cancel or CancelToken(), stats), stats)

    @property
    def forward_calls(self) -> int:
        return self.model.forward_calls

    def _run(self, request: GenerationRequest, cancel: CancelToken, stats: GenerationStats) -> Iterator[TokenEvent]:
        t_queue = time.perf_counter()
        with self._lock:
            self.generating = True
            self.requests_started += 1
            try:
                stats.queued_ms = (time.perf_counter() - t_queue) * 1000
                yield from self._decode(request, cancel, stats)
            except NativeError:
                self._kv_tokens = []  # the cache may hold anything now
                raise
            finally:
                self.generating = False

    def _reusable_prefix(self, prompt: list[int]) -> int:
        if not self.prefix_reuse:
            return 0
        n = 0
        limit = min(len(prompt) - 1, len(self._kv_tokens))  # the last prompt token is always run
        while n < limit and prompt[n] == self._kv_tokens[n]:
            n += 1
        return n

    def _decode(self, request: GenerationRequest, cancel: CancelToken, stats: GenerationStats) -> Iterator[TokenEvent]:
        model, prompt, sampling = self.model, request.prompt, request.sampling
        rng = sampling.initial_rng_state()
        pos = self._reusable_prefix(prompt)
        stats.cached_tokens = pos
        self._kv_tokens = self._kv_tokens[:pos]
        history = list(prompt) if sampling.uses_history else []

        t0 = time.perf_counter()
        while pos < len(prompt):
            if cancel.cancelled:
                stats.finish_reason = "cancelled"
                return
            chunk = prompt[pos : pos + self.prefill_chunk]
            last = pos + len(chunk) == len(prompt)
            if last:
                token, logprob, rng = self._offload(self._step, chunk, pos, sampling, rng, history)
            else:
                self._offload(model.forward, chunk, pos)
            self._kv_tokens.extend(chunk)
            pos += len(chunk)
        t1 = time.perf_counter()
        stats.prompt_ms = (t1 - t0) * 1000

        max_new = min(request.max_tokens, self.context_length - len(prompt))
        try:
            while True:
                stats.completion_tokens += 1
                yield TokenEvent(token, logprob)
                if token in request.stop_token_ids:
                    stats.finish_reason = "stop"
                    return
                if stats.completion_tokens >= max_new:
                    stats.finish_reason = "length"
                    return
                if cancel.cancelled:
                    stats.finish_reason = "cancelled"
                    return
                if sampling.uses_history:
                    history.append(token)
                fed = token
                token, logprob, rng = self._offload(self._step, [fed], pos, sampling, rng, history)
                self._kv_tokens.append(fed)
                pos += 1
        finally:
            stats.decode_ms = (time.perf_counter() - t1) * 1000

    def _step(self, tokens: list[int], pos: int, sampling: SamplingParams, rng: int, history: list[int]):
        """One forward call and one sample, run off the event loop."""
        self.model.forward(tokens, pos)
        return self.model.sample(sampling, rng, history)
