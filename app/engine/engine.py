"""The engine: one model, one lock, token ids in and token ids out.

Generation is serialized: a request holds the lock from its first prefill chunk
to its last decode step. The KV cache keeps what the previous request left in
it, so a prompt that starts with the same tokens prefills only the rest. With
sessions (sessions.py), the states of other recent conversations are saved
aside and copied back when their next request comes; with a session directory
they are also kept on disk, across restarts.

A request may ask for PromptProgress events while its prompt is read
(`report_progress`); /health reads the running prefill's progress from
`Engine.prompt_progress`. With `context_shift`, a generation that fills the
context drops the oldest half of what follows the first `keep` tokens and goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Protocol, Union

from .cancel import CancelToken
from .native import NativeError, NativeModel
from .offload import run_blocking
from .sessions import DiskSessions, KvSessions
from .sampling import SamplingParams


class QueueFullError(RuntimeError):
    """Too many requests are already waiting for the engine."""

    def __init__(self, waiting: int):
        super().__init__(f"{waiting} requests are already waiting for the model; try again shortly")
        self.waiting = waiting


class QueueTimeoutError(RuntimeError):
    """A request waited longer than the queue allows."""

    def __init__(self, waited_s: float):
        super().__init__(f"the request waited {waited_s:.0f} s for the model and was dropped; try again later")


class ContextLengthError(ValueError):
    """The prompt leaves no room in the context for even one new token."""

    def __init__(self, prompt_tokens: int, context_length: int):
        super().__init__(
            f"the prompt has {prompt_tokens} tokens, but this model's context holds {context_length}"
        )
        self.prompt_tokens = prompt_tokens
        self.context_length = context_length


class TokenConstraint(Protocol):
    """One generation's grammar state (app.grammar.TokenMatcher is one)."""

    def allowed(self) -> bytes: ...  # next-token bitmask, as ets_sampling.allowed takes it
    def accept(self, token_id: int) -> None: ...


class ConstraintSource(Protocol):
    def matcher(self) -> TokenConstraint: ...  # a fresh state for each generation


@dataclass(frozen=True)
class GenerationRequest:
    prompt: list[int]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_token_ids: frozenset[int] = frozenset()
    top_logprobs: int = 0  # alternatives reported with each token
    session_id: str | None = None  # the conversation whose saved KV state to continue from
    constraint: ConstraintSource | None = None  # a grammar the output must follow
    report_progress: bool = False  # also yield PromptProgress events while the prompt is read
    keep: int | None = None  # context shift: tokens at the start never dropped (e.g. the system
    #                          prompt's); the engine's own --keep, when set, wins


@dataclass(frozen=True)
class PromptProgress:
    """How far the reading of a prompt has got (llama.cpp's `prompt_progress`)."""

    total: int  # the prompt's tokens
    cache: int  # of those, reused from the KV cache (not computed again)
    processed: int  # in the cache so far, cached ones included: from `cache` up to `total`
    time_ms: int  # since this request started on its prompt

    def as_dict(self) -> dict:
        return {"total": self.total, "cache": self.cache, "processed": self.processed, "time_ms": self.time_ms}


@dataclass(frozen=True)
class TokenEvent:
    token_id: int
    logprob: float  # under the model's own distribution
    top: tuple[tuple[int, float], ...] = ()  # the most likely alternatives, most likely first


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None  # "stop", "length" or "cancelled"
    queued_ms: float = 0.0
    prompt_ms: float = 0.0
    decode_ms: float = 0.0
    context_shifts: int = 0  # times the context was full and its older half dropped


Event = Union[TokenEvent, PromptProgress]


class Generation:
    """Iterate for TokenEvents (and, if the request asked, PromptProgress events before
    the first token); `stats` is complete once iteration ends."""

    def __init__(self, events: Iterator[Event], stats: GenerationStats):
        self._events = events
        self.stats = stats

    def __iter__(self) -> Iterator[Event]:
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
        max_queue: int = 16,
        queue_timeout: float = 300.0,
        offload: Callable = run_blocking,
        session_cache_mib: float = 512,
        session_dir: str | Path | None = None,
        session_dir_mib: float = 4096,
        model_identity: str = "",
        context_shift: bool = False,
        keep: int = -1,
    ):
        self.model = model
        self.context_length = model.info.max_seq_len
        self.prefill_chunk = max(1, min(prefill_chunk, model.info.max_prefill_len))
        self.prefix_reuse = prefix_reuse
        self.max_queue = max_queue  # requests allowed to wait while one generates
        self.queue_timeout = queue_timeout
        self._offload = offload
        self._line = _FifoLock()  # generation is serialized, waiting requests served in arrival order
        self._kv_tokens: list[int] = []  # tokens whose keys/values fill positions 0..n-1
        self.generating = False
        self.requests_started = 0
        self.context_shift = context_shift  # at the end of the context: drop the older half and go on
        self.keep = keep  # tokens a shift keeps at the start; -1: the request's `keep`, else 0
        self.prompt_progress: PromptProgress | None = None  # the prompt being read right now
        # saved KV states of recent sessions, and which one the live cache holds
        log = logging.getLogger("etserve")
        disk = None
        if session_dir:
            disk = DiskSessions(Path(session_dir), int(session_dir_mib * 2**20), model_identity, log)
        self.sessions = KvSessions(model, int(session_cache_mib * 2**20), offload, log, disk=disk)
        # called with each finished generation's complete stats (metrics); must not raise
        self.observers: list[Callable[[GenerationStats], None]] = []

    def check_fits(self, prompt_tokens: int) -> None:
        if prompt_tokens >= self.context_length:
            raise ContextLengthError(prompt_tokens, self.context_length)

    def check_admission(self) -> None:
        """Refuse new work while the wait queue is full (checked before a response starts)."""
        if self.generating and self.waiting >= self.max_queue:
            raise QueueFullError(self.waiting)

    def generate(self, request: GenerationRequest, cancel: CancelToken | None = None) -> Generation:
        """Start a generation (lazily: the lock is taken on first iteration).

        Raises ContextLengthError at once; iteration raises QueueTimeoutError
        if the wait for the lock exceeds the queue timeout. Callers check
        admission (check_admission) before they start a response.
        """
        if not request.prompt:
            raise ValueError("the prompt is empty")
        self.check_fits(len(request.prompt))
        stats = GenerationStats(prompt_tokens=len(request.prompt))
        cancel = cancel or CancelToken()
        cancel.generations.append(stats)
        return Generation(self._run(request, cancel, stats), stats)

    @property
    def forward_calls(self) -> int:
        return self.model.forward_calls

    @property
    def vocab_size(self) -> int:
        """The model's logits: token ids 0..vocab_size-1."""
        return self.model.info.vocab_size

    @property
    def waiting(self) -> int:
        """Requests waiting in line for the engine."""
        return self._line.waiting

    def _acquire(self, cancel: CancelToken, stats: GenerationStats) -> bool:
        """Wait in line for the engine; False if the client left meanwhile."""
        t0 = time.perf_counter()
        try:
            got = self._line.acquire(lambda: cancel.cancelled, self.queue_timeout)
        finally:
            stats.queued_ms = (time.perf_counter() - t0) * 1000
        if got is None:
            raise QueueTimeoutError(time.perf_counter() - t0)
        if got and cancel.cancelled:  # gone while we were at the head of the line
            self._line.release()
            return False
        return got

    def _run(self, request: GenerationRequest, cancel: CancelToken, stats: GenerationStats) -> Iterator[TokenEvent]:
        if not self._acquire(cancel, stats):
            stats.finish_reason = "cancelled"
            return
        failed = False
        try:
            self.generating = True
            self.requests_started += 1
            yield from self._decode(request, cancel, stats)
        except NativeError:
            failed = True
            self._kv_tokens = []  # the cache may hold anything now
            self.sessions.lost()
            raise
        finally:
            self.prompt_progress = None
            try:
                if not failed:  # the live state, on disk for later conversations and restarts
                    self.sessions.persist_live(self._kv_tokens)
            finally:
                self.generating = False
                self._line.release()
            for observe in self.observers:
                observe(stats)

    def flush_sessions(self, timeout: float | None) -> bool:
        """At worker exit: wait until the session states queued for --session-dir are on disk
        (they are written in the background after each generation). False if some were not in
        time; the files are written atomically, so a state cut short is only missing."""
        disk = self.sessions.disk
        if disk is None:
            return True
        queued = disk.queued
        if not queued:
            return True
        log = logging.getLogger("etserve")
        log.info("writing %d session state(s) to %s before exiting", queued, disk.directory)
        done = disk.flush(timeout)
        if not done:
            log.warning("%d session state(s) not written to %s: exiting after %.0f s", disk.queued,
                        disk.directory, timeout)
        return done

    def drop_session(self, session_id: str) -> bool:
        """DELETE a session: its saved state goes; False if the engine never heard of it."""
        return self.sessions.forget(session_id)

    def session_entries(self) -> list[dict]:
        return self.sessions.entries(len(self._kv_tokens))

    def sessions_report(self) -> dict:
        """What GET /v1/sessions shows: the saved sessions, and whether and why sessions are off."""
        sessions = self.sessions
        return {
            "entries": self.session_entries(),
            "enabled": sessions.enabled,
            "disabled_reason": None if sessions.enabled else sessions.off_reason,
            "max_bytes": sessions.cache.max_bytes,
            "used_bytes": sessions.cache.used_bytes,
        }

    def _reusable_prefix(self, prompt: list[int]) -> int:
        if not self.prefix_reuse:
            return 0
        n = 0
        limit = min(len(prompt) - 1, len(self._kv_tokens))  # the last prompt token is always run
        while n < limit and prompt[n] == self._kv_tokens[n]:
            n += 1
        return n

    def _decode(self, request: GenerationRequest, cancel: CancelToken, stats: GenerationStats) -> Iterator[Event]:
        model, prompt, sampling = self.model, request.prompt, request.sampling
        rng = sampling.initial_rng_state()
        started = time.perf_counter()
        self._kv_tokens = self.sessions.switch(self._kv_tokens, prompt, request.session_id, self.prefix_reuse)
        pos = self._reusable_prefix(prompt)
        stats.cached_tokens = pos
        self._kv_tokens = self._kv_tokens[:pos]
        history = list(prompt) if sampling.uses_history else []
        constraint = request.constraint.matcher() if request.constraint is not None else None

        def progress() -> PromptProgress:
            self.prompt_progress = PromptProgress(len(prompt), stats.cached_tokens, pos,
                                                  int((time.perf_counter() - started) * 1000))
            return self.prompt_progress

        first = progress()
        if request.report_progress:
            yield first
        t0 = time.perf_counter()
        while pos < len(prompt):
            if cancel.cancelled:
                stats.finish_reason = "cancelled"
                return
            chunk = prompt[pos : pos + self.prefill_chunk]
            last = pos + len(chunk) == len(prompt)
            if last:
                event, rng = self._offload(self._step, chunk, pos, request, rng, history, constraint)
            else:
                self._offload(model.forward, chunk, pos)
            self._kv_tokens.extend(chunk)
            pos += len(chunk)
            update = progress()
            if request.report_progress:
                yield update
        t1 = time.perf_counter()
        stats.prompt_ms = (t1 - t0) * 1000
        self.prompt_progress = None

        if self.context_shift:
            max_new = request.max_tokens
            keep = self.keep if self.keep >= 0 else (request.keep or 0)
            keep = max(0, min(keep, len(prompt), self.context_length - 4))
        else:
            max_new = min(request.max_tokens, self.context_length - len(prompt))
        try:
            while True:
                stats.completion_tokens += 1
                yield event
                token = event.token_id
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
                if pos >= self.context_length:  # no position left for `token`: only with context_shift
                    shifted = self._shift(token, keep, request, rng, history, constraint, cancel)
                    if shifted is None:
                        stats.finish_reason = "cancelled"
                        return
                    event, rng = shifted
                    pos = len(self._kv_tokens)
                    stats.context_shifts += 1
                    continue
                event, rng = self._offload(self._step, [token], pos, request, rng, history, constraint)
                self._kv_tokens.append(token)
                pos += 1
        finally:
            stats.decode_ms = (time.perf_counter() - t1) * 1000

    def _shift(self, token: int, keep: int, request: GenerationRequest, rng: int, history: list[int],
               constraint: TokenConstraint | None, cancel: CancelToken) -> tuple[TokenEvent, int] | None:
        """Context shift: keep the first `keep` cached tokens, drop the oldest half of the rest,
        and read what remains (and `token`) again after the kept ones, as a fresh prompt would be.

        The kept tokens' keys and values stay where they are (a fresh run computes the same);
        the others are computed again at their new positions (exact, where moving cached
        keys would need their rotary embedding undone). None if cancelled meanwhile."""
        kv = self._kv_tokens
        discard = (len(kv) - keep) // 2
        rest = kv[keep + discard :] + [token]
        self._kv_tokens = kv[:keep]
        if request.sampling.uses_history:  # as a fresh run on the kept tokens would see them
            history[:] = self._kv_tokens + rest
        pos = keep
        while True:
            if cancel.cancelled:
                return None
            chunk = rest[: self.prefill_chunk]
            rest = rest[len(chunk) :]
            if not rest:
                event, rng = self._offload(self._step, chunk, pos, request, rng, history, constraint)
                self._kv_tokens.extend(chunk)
                return event, rng
            self._offload(self.model.forward, chunk, pos)
            self._kv_tokens.extend(chunk)
            pos += len(chunk)

    def _step(self, tokens: list[int], pos: int, request: GenerationRequest, rng: int,
              history: list[int], constraint: TokenConstraint | None) -> tuple[TokenEvent, int]:
        """One forward call and one sample (within the grammar, if any), run off the event loop."""
        self.model.forward(tokens, pos)
        allowed = constraint.allowed() if constraint is not None else None
        token, logprob, rng = self.model.sample(request.sampling, rng, history, allowed)
        if constraint is not None:
            constraint.accept(token)
        top = tuple(self.model.top_logprobs(request.top_logprobs)) if request.top_logprobs else ()
        return TokenEvent(token, logprob, top), rng


class _FifoLock:
    """A lock whose waiters get it in arrival order: a release hands it to the oldest waiter.

    (threading.Lock promises no order: a request that arrived later could overtake.)
    Under gevent, threading is monkey-patched and the events are gevent's.
    """

    _POLL_S = 0.25  # how often a waiter checks whether its client left

    def __init__(self):
        self._mutex = threading.Lock()  # guards the fields below, held only briefly
        self._held = False
        self._line: deque[threading.Event] = deque()  # oldest first

    @property
    def waiting(self) -> int:
        return len(self._line)

    def acquire(self, gave_up: Callable[[], bool], timeout: float) -> bool | None:
        """True once the lock is ours; False if `gave_up()` turned true while waiting;
        None after `timeout` seconds in line."""
        with self._mutex:
            if not self._held and not self._line:
                self._held = True
                return True
            turn = threading.Event()
            self._line.append(turn)
        deadline = time.perf_counter() + timeout
        while not turn.wait(self._POLL_S):
            left = gave_up()
            if left or time.perf_counter() > deadline:
                with self._mutex:
                    if not turn.is_set():  # still in line: leave it
                        self._line.remove(turn)
                        return False if left else None
                break  # handed over meanwhile: the lock is ours (the caller checks its client again)
        return True

    def release(self) -> None:
        with self._mutex:
            if self._line:
                self._line.popleft().set()  # ownership passes straight to the oldest waiter
            else:
                self._held = False
