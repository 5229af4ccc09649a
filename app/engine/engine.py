"""The engine: one model, one forward call at a time, several requests in flight.

Each request in flight has a sequence slot (slots.py): a KV state of its own in the runtime,
kept between its steps and switched by pointer. What holds the runtime is one forward step
(a prefill chunk, or a decode step and its sample), not a request: before every step a
sequence asks the step gate (steps.py), and between steps the scheduling policy
(scheduler.py) picks who goes next, so a short request is not stuck behind a long one and
decoding streams take turns. A slot keeps what its last request left in it, so a prompt that
starts the same way reads only the rest. With sessions (sessions.py), the states of other
recent conversations are saved aside and copied back when their next request comes; with a
session directory they are also kept on disk, across restarts.

A request may ask for PromptProgress events while its prompt is read
(`report_progress`); /health reads the running prefill's progress from
`Engine.prompt_progress`. With `context_shift`, a generation that fills the
context drops the oldest half of what follows the first `keep` tokens and goes on.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Protocol, Union

from .batching import DecodeJob, choose_batch, grammar_drafts, rows_of, verify
from .cancel import CancelToken
from .drafts import DraftController, Drafter, StepCosts, SuffixStore
from .kv_budget import plan as plan_trims
from .native import NativeError, NativeModel, Status
from .offload import run_blocking
from .sampling import SamplingParams
from .scheduler import Claim, PrefillCost, StepPolicy
from .sessions import DiskSessions, KvSessions, common_prefix
from .slots import Slot, SlotTable
from .steps import StepGate


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
    # and, optionally, for speculative decoding (batching.grammar_drafts):
    # valid_prefix(tokens) -> int: how many of tokens the grammar would take in order, consuming none
    # forced() -> list[int]: the tokens the grammar forces from here


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
    reuse_prefix: bool = True  # False (llama.cpp's cache_prompt: false): the whole prompt is computed


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
    finish_reason: str | None = None  # "stop", "length", "cancelled"; "queue_timeout" (it never ran)
    slot: int | None = None  # the sequence slot it ran in
    queued_ms: float = 0.0  # from arrival to its first step: waiting for a slot and a turn
    prompt_ms: float = 0.0
    decode_ms: float = 0.0
    context_shifts: int = 0  # times the context was full and its older half dropped
    drafted: int = 0  # tokens guessed by speculative decoding and checked
    draft_accepted: int = 0  # of those, the ones the model agreed with


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


_CANCELLED = object()  # what a step returns when its request was cancelled while it waited


def same_document(older: list[int], newer: list[int]) -> bool:
    """Whether an editor's new completion is for the document of one in flight: typing at the
    cursor changes the prompt only around it, so the two share most of their tokens at the start
    (what is above the cursor, and the context chunks before it) and at the end (what is below it).
    Another document, or another editor window with its own context chunks, shares little."""
    shorter = min(len(older), len(newer))
    head = common_prefix(older, newer, shorter)
    tail = common_prefix(older[::-1], newer[::-1], shorter - head)
    return head + tail >= shorter // 2


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
        slots: int = 1,
        policy: StepPolicy | None = None,
        prefill_step_s: float = 0.5,
        draft_max: int = 32,
        draft_sampled: bool = True,
        kv_cache_mib: float = -1,
    ):
        self.model = model
        self.context_length = model.info.max_seq_len
        self.prefill_chunk = max(1, min(prefill_chunk, model.info.max_prefill_len))
        self.prefix_reuse = prefix_reuse
        self.prefill_step_s = prefill_step_s  # a prefill step's longest time: chunks shrink to fit (0: off)
        self.max_queue = max_queue  # requests allowed to wait for a slot while all are busy
        self.queue_timeout = queue_timeout
        self._offload = offload
        self.requests_started = 0
        self.context_shift = context_shift  # at the end of the context: drop the older half and go on
        self.keep = keep  # tokens a shift keeps at the start; -1: the request's `keep`, else 0
        self._seq = itertools.count(1)
        self.prefill_cost = PrefillCost()  # what reading a prompt takes, as measured
        self._gate = StepGate(policy)
        # key -> the client's completions in flight: (cancel, [its slot], prompt)
        self._superseding: dict[str, list[tuple[CancelToken, list, list[int]]]] = {}
        self.superseded = 0
        log = logging.getLogger("etserve")
        self.slot_memory_note = ""
        self.slot_table = SlotTable(1)
        # rows builds: decode steps of several sequences share a forward call, drafts are verified
        self.max_rows = min(getattr(model.info, "max_rows", 0), model.info.max_prefill_len)
        self._pending: dict[int, DecodeJob] = {}  # decode steps waiting for the gate, by claim
        self.draft_max = max(0, min(draft_max, self.max_rows - 1)) if self.max_rows > 1 else 0
        self.draft_store = SuffixStore() if self.draft_max else None  # recent outputs, for drafts
        self.step_costs = StepCosts(self.max_rows)  # a decode step's time by its rows, for draft lengths
        # sampled requests (temperature > 0) draft too: for a seed their tokens are plain
        # decoding's (tests/engine/test_speculation.py: with penalties, a grammar, and an agent's
        # tool-calling prompt on the default model), so the distribution is unchanged
        self.draft_sampled = draft_sampled
        self.drafted = self.draft_accepted = 0  # totals, for /metrics
        # what the slots' caches keep once their requests end (kv_budget.py); None: one context's worth
        self.kv_cache_bytes = None if kv_cache_mib < 0 else int(kv_cache_mib * 2**20)
        self._kv_bpp: int | None = None  # the caches' bytes a position; 0: not ours to see
        self._memory_due = False
        self.kv_trimmed = 0  # positions idle slots gave back to fit the budget (/metrics)
        # saved KV states of recent sessions, and which one each slot holds
        disk = None
        if session_dir:
            disk = DiskSessions(Path(session_dir), int(session_dir_mib * 2**20), model_identity, log)
        self.sessions = KvSessions(model, int(session_cache_mib * 2**20), offload, log, disk=disk)
        if slots > 1:
            self._make_slots(slots, log)
        # called with each finished generation's complete stats (metrics); must not raise
        self.observers: list[Callable[[GenerationStats], None]] = []

    def _make_slots(self, n: int, log: logging.Logger) -> None:
        """n sequence slots in the runtime (one forward call first, if none has found the caches
        yet); a model whose caches cannot be switched keeps one, with a warning."""
        model = self.model
        try:
            try:
                model.set_slots(n)
            except NativeError as e:
                if e.code != Status.STATE:
                    raise
                model.forward([model.info.bos_id or 0], 0)  # the caches are found on a first call
                model.set_slots(n)
        except (NativeError, AttributeError) as e:
            log.warning("one sequence slot: this model's KV caches cannot be switched (%s); requests "
                        "are served one at a time", e)
            return
        self.slot_table.resize(n)
        reserved = sum(model.slot_memory(i)[0] for i in range(1, n))
        self.slot_memory_note = (f"{n} sequence slots of {self.context_length} positions: slot 0 in the "
                                 f"program's memory, {n - 1} more mapped ({reserved / 2**20:.0f} MiB at most, "
                                 f"used as positions are written)")
        log.info("%s", self.slot_memory_note)

    # -- state for /health, /slots, /metrics
    @property
    def slots(self) -> list[Slot]:
        return self.slot_table.slots

    @property
    def generating(self) -> bool:
        return self.slot_table.busy > 0

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot."""
        return self.slot_table.waiting

    @property
    def prompt_progress(self) -> PromptProgress | None:
        """The prompt being read right now (the most advanced, if several are)."""
        reading = [s for s in self.slots if s.busy and s.task == "prefill"]
        if not reading:
            return None
        s = max(reading, key=lambda s: s.processed)
        return PromptProgress(s.prompt_tokens, s.cached_tokens, s.processed,
                              int((time.perf_counter() - s.started) * 1000))

    def slot_memory(self) -> list[dict]:
        out = []
        for s in self.slots:
            reserved = resident = 0
            try:
                reserved, resident = self.model.slot_memory(s.index)
            except (NativeError, AttributeError):
                pass
            out.append({"id": s.index, "reserved_bytes": reserved, "resident_bytes": resident})
        return out

    def kv_budget(self) -> int | None:
        """Bytes the slots' caches keep in all once their requests end (kv_budget.py): --kv-cache-mib,
        by default one context's worth; None while no forward call has found the caches, or for a
        model whose caches are not ours to see."""
        if self._kv_bpp is None:
            try:
                self._kv_bpp = self.model.kv_info().bytes_per_position
            except NativeError as e:
                if e.code == Status.STATE:
                    return None  # not yet
                self._kv_bpp = 0
        if not self._kv_bpp:
            return None
        return self.kv_cache_bytes if self.kv_cache_bytes is not None else self._kv_bpp * self.context_length

    def _fit_memory(self) -> None:
        """(Under the gate, no forward call running) Idle slots give back what lies past their
        tokens, then are cut to keep the caches within the budget (kv_budget.py)."""
        self._memory_due = False
        budget = self.kv_budget()
        if budget is None:
            return
        model = self.model
        try:
            for slot in self.slots:
                if not slot.busy:
                    model.trim_slot(slot.index, len(slot.tokens))
            resident = {s.index: model.slot_memory(s.index)[1] for s in self.slots}
            for cut in plan_trims(self.slots, resident, budget, self._kv_bpp):
                slot = self.slots[cut.slot]
                model.trim_slot(cut.slot, cut.keep)
                self.kv_trimmed += max(0, len(slot.tokens) - cut.keep)
                slot.tokens = slot.tokens[:cut.keep]
        except NativeError as e:  # memory is not given back; nothing served is affected
            logging.getLogger("etserve").warning("KV memory is no longer given back: %s", e)
            self._kv_bpp = 0

    def _fit_memory_if_due(self) -> None:
        if self._memory_due:
            self._fit_memory()

    def slots_report(self) -> list[dict]:
        """GET /slots: each slot's state, and its memory (slot 0's is the program's own)."""
        memory = {m["id"]: m for m in self.slot_memory()}
        return [{**s.state(), "n_ctx": self.context_length,
                 "memory": {k: v for k, v in memory[s.index].items() if k != "id"}} for s in self.slots]

    @property
    def steps(self) -> StepGate:
        return self._gate

    @property
    def idle(self) -> bool:
        """No request holds or waits for a slot and no step runs: the runtime may be freed."""
        return not (self.slot_table.busy or self.slot_table.waiting or self._gate.holder is not None
                    or self._gate.waiting)

    def wait_idle(self, timeout: float) -> bool:
        """Wait (polling; a gevent sleep under the server) until `idle`; False if it was not in
        `timeout` seconds. A response's body can close while its request's last step still runs in
        the native thread pool: whoever frees the runtime waits here first."""
        deadline = time.monotonic() + timeout
        while not self.idle:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    def check_fits(self, prompt_tokens: int) -> None:
        if prompt_tokens >= self.context_length:
            raise ContextLengthError(prompt_tokens, self.context_length)

    def check_admission(self) -> None:
        """Refuse new work while every slot is busy and the wait queue is full (checked before a
        response starts)."""
        if self.slot_table.busy >= len(self.slot_table) and self.waiting >= self.max_queue:
            raise QueueFullError(self.waiting)

    def generate(self, request: GenerationRequest, cancel: CancelToken | None = None) -> Generation:
        """Start a generation (lazily: it waits for a slot on first iteration).

        Raises ContextLengthError at once; iteration raises QueueTimeoutError
        if the wait for a slot exceeds the queue timeout. Callers check
        admission (check_admission) before they start a response.
        """
        if not request.prompt:
            raise ValueError("the prompt is empty")
        self.check_fits(len(request.prompt))
        stats = GenerationStats(prompt_tokens=len(request.prompt))
        cancel = cancel or CancelToken()
        cancel.generations.append(stats)
        claim = Claim(seq=next(self._seq), arrival=self._gate.clock(),
                      size=self.prefill_cost.estimate(0, len(request.prompt)))  # until its cached part is known
        holder: list = []  # the slot this generation runs in, once it has one
        prefer = None
        key = cancel.supersede_key
        if key is not None:
            in_flight = self._superseding.setdefault(key, [])
            for older_cancel, older_holder, older_prompt in list(in_flight):
                # (a request's own choices never do; another document's completion is left alone)
                if older_cancel is cancel or not same_document(older_prompt, request.prompt):
                    continue
                if not older_cancel.cancelled:
                    older_cancel.cancel("superseded by a newer request")
                    self.superseded += 1
                prefer = older_holder[0] if older_holder else prefer
                in_flight[:] = [e for e in in_flight if e[0] is not older_cancel]
            in_flight.append((cancel, holder, request.prompt))
        cancel.listeners.append(lambda: self._gate.drop(claim))
        return Generation(self._run(request, cancel, stats, claim, holder, prefer), stats)

    @property
    def forward_calls(self) -> int:
        return self.model.forward_calls

    @property
    def vocab_size(self) -> int:
        """The model's logits: token ids 0..vocab_size-1."""
        return self.model.info.vocab_size

    # -- one request
    def _run(self, request: GenerationRequest, cancel: CancelToken, stats: GenerationStats, claim: Claim,
             holder: list, prefer: Slot | None) -> Iterator[Event]:
        t0 = time.perf_counter()
        try:
            slot = self.slot_table.acquire(request.prompt, request.session_id, lambda: cancel.cancelled,
                                           self.queue_timeout, prefer=prefer)
        finally:
            stats.queued_ms = (time.perf_counter() - t0) * 1000
        if slot is None or slot is False:  # it waited and never ran: observed all the same (its wait)
            self._forget_key(cancel, holder)
            stats.finish_reason = "queue_timeout" if slot is None else "cancelled"
            for observe in self.observers:
                observe(stats)
            if slot is None:
                raise QueueTimeoutError(time.perf_counter() - t0)
            return
        holder.append(slot)
        stats.slot = slot.index
        slot.request = claim.seq
        slot.prompt_tokens = len(request.prompt)
        slot.cached_tokens = slot.processed = slot.generated = 0
        failed = False
        try:
            self.requests_started += 1
            yield from self._decode(slot, claim, request, cancel, stats, t0)
        except NativeError:
            failed = True
            KvSessions.lost(slot)  # its caches may hold anything now
            raise
        finally:
            try:
                if not failed and self.sessions.disk is not None:  # its state, on disk for later and restarts
                    self._with_step(slot, claim, None, self.sessions.persist_live, slot)
            finally:
                self._forget_key(cancel, holder)
                self.slot_table.release(slot)
                # its slot's memory past what it holds goes back, and the idle slots' caches are
                # fitted to the budget: now if no step runs, else by the next step (never waited for)
                self._memory_due = True
                self._gate.run_if_free(claim, self._fit_memory_if_due)
                self._gate.done(claim)  # a step kept for it goes to the others now
            for observe in self.observers:
                observe(stats)

    def _forget_key(self, cancel: CancelToken, holder: list) -> None:
        key = cancel.supersede_key
        if key is not None:
            in_flight = self._superseding.get(key, [])
            in_flight[:] = [e for e in in_flight if e[1] is not holder]
            if not in_flight:
                self._superseding.pop(key, None)

    def _with_step(self, slot: Slot, claim: Claim, cancel: CancelToken | None, fn: Callable, *args):
        """Run `fn` as one step of this sequence: wait for its turn (_CANCELLED if its request
        was cancelled meanwhile), select its slot in the runtime, run, hand the turn on."""
        gave_up = (lambda: cancel.cancelled) if cancel is not None else (lambda: False)
        if (cancel is not None and cancel.cancelled) or not self._gate.acquire(claim, gave_up):
            return _CANCELLED
        t = time.perf_counter()
        try:
            if len(self.slot_table) > 1:
                self.model.select_slot(slot.index)
            return fn(*args)
        finally:
            self._fit_memory_if_due()
            self._gate.release(claim, time.perf_counter() - t)

    def _prepare(self, slot: Slot, request: GenerationRequest) -> int:
        """Under the gate, the slot selected: make its cache ready for the prompt (a session's
        saved state, or a longer shared prefix another slot holds); returns the prompt tokens
        it already holds."""
        prompt = request.prompt
        reuse = self.prefix_reuse and request.reuse_prefix
        slot.tokens = self.sessions.switch(slot, prompt, request.session_id, reuse)
        pos = self._reusable_prefix(slot.tokens, prompt) if reuse else 0
        if reuse and len(self.slot_table) > 1:
            limit = len(prompt) - 1
            donor, n = None, pos
            for other in self.slots:
                if other is not slot and (k := common_prefix(prompt, other.tokens, limit)) > n:
                    donor, n = other, k
            if donor is not None and n - pos >= 16:  # worth a copy rather than a recompute
                self._offload(self.model.copy_slot, donor.index, slot.index, n)
                slot.tokens = list(donor.tokens[:n])
                pos = n
        slot.tokens = slot.tokens[:pos]
        return pos

    def _chunk_size(self, per_token: float | None) -> int:
        """Prompt tokens for the next prefill step: --prefill-chunk, fewer when a step that long
        would take more than `prefill_step_s` (a long context on a slow CPU), so that a request
        arriving meanwhile waits a fraction of a second; a multiple of 16, at least 16."""
        if per_token is None or self.prefill_step_s <= 0 or per_token <= 0:
            return self.prefill_chunk
        fits = int(self.prefill_step_s / (per_token * 1.1)) // 16 * 16  # the context grows: 10% spare
        return max(min(16, self.prefill_chunk), min(self.prefill_chunk, fits))

    def _reusable_prefix(self, kv: list[int], prompt: list[int]) -> int:
        if not self.prefix_reuse:
            return 0
        return common_prefix(prompt, kv, len(prompt) - 1)  # the last prompt token is always run

    def _decode(self, slot: Slot, claim: Claim, request: GenerationRequest, cancel: CancelToken,
                stats: GenerationStats, arrived: float) -> Iterator[Event]:
        model, prompt, sampling = self.model, request.prompt, request.sampling
        rng = sampling.initial_rng_state()
        slot.task = "prefill"
        slot.started = time.perf_counter()  # (the prompt's time counts from here, not the slot's last request)
        pos = self._with_step(slot, claim, cancel, self._prepare, slot, request)
        if pos is _CANCELLED:
            stats.finish_reason = "cancelled"
            return
        claim.size = self.prefill_cost.estimate(pos, len(prompt) - pos)  # what is left to read, once the cache is known
        started = slot.started = time.perf_counter()
        stats.queued_ms = (started - arrived) * 1000
        stats.cached_tokens = slot.cached_tokens = slot.processed = pos
        history = list(prompt) if sampling.uses_history else []
        constraint = request.constraint.matcher() if request.constraint is not None else None

        def progress() -> PromptProgress:
            slot.processed = pos
            return PromptProgress(len(prompt), stats.cached_tokens, pos, int((time.perf_counter() - started) * 1000))

        first = progress()
        if request.report_progress:
            yield first
        t0 = time.perf_counter()
        event = None
        per_token = None  # seconds a prompt token took in this sequence's last chunk
        while pos < len(prompt):
            chunk = prompt[pos : pos + self._chunk_size(per_token)]
            last = pos + len(chunk) == len(prompt)
            served = claim.service
            if last:
                out = self._with_step(slot, claim, cancel, self._sample_step, chunk, pos, request, rng, history,
                                      constraint)
            else:
                out = self._with_step(slot, claim, cancel, self._offload, model.forward, chunk, pos)
            if out is _CANCELLED:
                stats.finish_reason = "cancelled"
                stats.prompt_ms = (time.perf_counter() - t0) * 1000  # what was read before it
                return
            if last:
                event, rng = out
            per_token = (claim.service - served) / len(chunk)
            self.prefill_cost.observe(pos, len(chunk), claim.service - served)
            slot.tokens.extend(chunk)
            pos += len(chunk)
            update = progress()
            if request.report_progress:
                yield update
        t1 = time.perf_counter()
        stats.prompt_ms = (t1 - t0) * 1000
        slot.task = "decode"
        claim.decoding = True

        if self.context_shift:
            max_new = request.max_tokens
            keep = self.keep if self.keep >= 0 else (request.keep or 0)
            keep = max(0, min(keep, len(prompt), self.context_length - 4))
        else:
            max_new = min(request.max_tokens, self.context_length - len(prompt))
        drafter = None
        if self.draft_max and (self.draft_sampled or sampling.temperature <= 0):
            drafter = Drafter(prompt, store=self.draft_store, controller=DraftController(max_k=self.draft_max, costs=self.step_costs))
        output: list[int] = []
        events = [event]
        try:
            while True:
                for event in events:
                    stats.completion_tokens += 1
                    slot.generated = stats.completion_tokens
                    yield event
                    token = event.token_id
                    output.append(token)
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
                if drafter is not None:
                    drafter.append([e.token_id for e in events])
                if pos >= self.context_length:  # no position left for `token`: only with context_shift
                    shifted = self._shift(slot, claim, token, keep, request, rng, history, constraint, cancel)
                    if shifted is None:
                        stats.finish_reason = "cancelled"
                        return
                    event, rng = shifted
                    events = [event]
                    pos = len(slot.tokens)
                    stats.context_shifts += 1
                    continue
                drafts: list[int] = []
                looked_up = True  # drafts from the drafter (it learns from their fate), not the grammar
                if drafter is not None:
                    limit = min(max_new - stats.completion_tokens - 1, self.context_length - pos - 1)
                    drafts = drafter.propose(limit=limit)
                    if constraint is not None:
                        drafts, looked_up = grammar_drafts(constraint, drafts, limit)
                out = self._decode_step(slot, claim, cancel, request, token, pos, drafts, rng, history, constraint,
                                        max_new - stats.completion_tokens)
                if out is _CANCELLED:
                    stats.finish_reason = "cancelled"
                    return
                events, rng, accepted, drafted = out  # drafted: what the call had room for
                if drafts:
                    if looked_up:
                        drafter.observe(drafted, accepted)
                    stats.drafted += drafted
                    stats.draft_accepted += accepted
                    self.drafted += drafted
                    self.draft_accepted += accepted
                # in the cache now: the token and the drafts the model agreed with
                slot.tokens.append(token)
                slot.tokens.extend(e.token_id for e in events[:-1])
                pos += len(events)
        finally:
            stats.decode_ms = (time.perf_counter() - t1) * 1000
            if self.draft_store is not None and output:
                self.draft_store.add(prompt[-512:] + output)

    def _decode_step(self, slot: Slot, claim: Claim, cancel: CancelToken, request: GenerationRequest, token: int,
                     pos: int, drafts: list[int], rng: int, history: list[int], constraint: TokenConstraint | None,
                     budget: int):
        """One decode step of this sequence: `token` at `pos` and the drafts after it, verified.
        Returns (events, rng, drafts accepted, drafts verified), or _CANCELLED. In a rows build the step may go into
        another sequence's forward call, or take theirs along (batching.py)."""
        state = [rng]
        uses_history = request.sampling.uses_history

        def sample(row: int, emitted: list[int]) -> TokenEvent:
            # row `row`: the model after `token` and drafts[:row] (== emitted): penalties see them too
            n = len(emitted) if uses_history else 0
            if n:
                history.extend(emitted)
            try:
                event, state[0] = self._sample(request, state[0], history, constraint)
            finally:
                if n:
                    del history[-n:]
            return event

        job = DecodeJob(claim, slot.index, token, pos, drafts, budget, sample, lambda: cancel.cancelled,
                        request.stop_token_ids)
        if self.max_rows <= 1:  # a plain build: one sequence's step per call
            if self._with_step(slot, claim, cancel, self._offload, self._run_batch, [job]) is _CANCELLED:
                return _CANCELLED
        elif self._run_shared(job, cancel) is _CANCELLED:
            return _CANCELLED
        return job.events, state[0], job.accepted, len(job.drafts)

    def _run_shared(self, job: DecodeJob, cancel: CancelToken):
        """Run a decode job in a rows build: wait for the step gate, unless a sequence holding it
        takes this job along into its call; holding it, take along the decode jobs waiting."""
        claim = job.claim
        self._pending[claim.seq] = job
        try:
            got = self._gate.acquire(claim, lambda: cancel.cancelled or job.taken)
        finally:
            if not job.taken:
                self._pending.pop(claim.seq, None)
        if job.taken and not got:  # another sequence's call carries it
            job.finished.wait()
            if job.error is not None:
                raise job.error
            return job
        if not got:
            return _CANCELLED
        t = time.perf_counter()
        batch = [job]
        job.taken = True
        try:
            if len(self.slot_table) > 1 and self.slot_table.busy > 1:
                time.sleep(0)  # (gevent) sequences that just got their tokens come back in line for this call
                waiting = [j for j in self._pending.values() if j is not job and not j.taken]
                if waiting:
                    batch = choose_batch(job, waiting, self.max_rows, self.context_length)
                    jobs = {j.claim.seq: j for j in batch}
                    along = self._gate.take_along([j.claim for j in batch if j is not job],
                                                  lambda c: setattr(jobs[c.seq], "taken", True))
                    along_seqs = {c.seq for c in along}
                    batch = [j for j in batch if j is job or j.claim.seq in along_seqs]
            for j in batch:
                self._pending.pop(j.claim.seq, None)
            self._offload(self._run_batch, batch)
        except BaseException as e:
            for j in batch:
                if j is not job and j.error is None:
                    j.error = e
            raise
        finally:
            share = (time.perf_counter() - t) / len(batch)
            others = [j for j in batch if j is not job]
            if others:
                self._gate.credit([j.claim for j in others], share)
                for j in others:
                    j.finished.set()
            self._fit_memory_if_due()
            self._gate.release(claim, share)
        if job.error is not None:
            raise job.error
        return job

    def _run_batch(self, batch: list[DecodeJob]) -> None:
        """(Off the event loop) One forward call for the jobs' rows, then each job's rows sampled;
        a job whose sampling fails gets the error (raised by its own sequence), the others go on.
        An error of the forward call itself is raised (every job's)."""
        model = self.model
        t = time.perf_counter()
        if len(batch) == 1 and not batch[0].drafts:
            job = batch[0]
            if len(self.slot_table) > 1:
                model.select_slot(job.slot)
            model.forward([job.token], job.pos)
            verify(job, 0, None)
            self.step_costs.record(1, time.perf_counter() - t)
            return
        tokens, positions, slots = rows_of(batch)
        model.forward_rows(tokens, positions, slots)
        row = 0
        for job in batch:
            try:
                verify(job, row, model.use_row)
            except Exception as e:
                job.error = e
            row += job.rows
        self.step_costs.record(len(tokens), time.perf_counter() - t)

    def _shift(self, slot: Slot, claim: Claim, token: int, keep: int, request: GenerationRequest, rng: int,
               history: list[int], constraint: TokenConstraint | None,
               cancel: CancelToken) -> tuple[TokenEvent, int] | None:
        """Context shift: keep the first `keep` cached tokens, drop the oldest half of the rest,
        and read what remains (and `token`) again after the kept ones, as a fresh prompt would be.

        The kept tokens' keys and values stay where they are (a fresh run computes the same);
        the others are computed again at their new positions (exact, where moving cached
        keys would need their rotary embedding undone). None if cancelled meanwhile."""
        kv = slot.tokens
        discard = (len(kv) - keep) // 2
        rest = kv[keep + discard :] + [token]
        slot.tokens = kv[:keep]
        if request.sampling.uses_history:  # as a fresh run on the kept tokens would see them
            history[:] = slot.tokens + rest
        pos = keep
        while True:
            chunk = rest[: self.prefill_chunk]
            rest = rest[len(chunk) :]
            if not rest:
                out = self._with_step(slot, claim, cancel, self._sample_step, chunk, pos, request, rng, history,
                                      constraint)
                if out is _CANCELLED:
                    return None
                slot.tokens.extend(chunk)
                return out
            out = self._with_step(slot, claim, cancel, self._offload, self.model.forward, chunk, pos)
            if out is _CANCELLED:
                return None
            slot.tokens.extend(chunk)
            pos += len(chunk)

    def _sample_step(self, tokens: list[int], pos: int, request: GenerationRequest, rng: int,
                     history: list[int], constraint: TokenConstraint | None) -> tuple[TokenEvent, int]:
        return self._offload(self._step, tokens, pos, request, rng, history, constraint)

    def _step(self, tokens: list[int], pos: int, request: GenerationRequest, rng: int,
              history: list[int], constraint: TokenConstraint | None) -> tuple[TokenEvent, int]:
        """One forward call and one sample (within the grammar, if any), run off the event loop."""
        self.model.forward(tokens, pos)
        return self._sample(request, rng, history, constraint)

    def _sample(self, request: GenerationRequest, rng: int, history: list[int],
                constraint: TokenConstraint | None) -> tuple[TokenEvent, int]:
        """A token from the logits the runtime holds now (a rows call: the row chosen with use_row),
        within the grammar; the grammar state takes it."""
        allowed = constraint.allowed() if constraint is not None else None
        token, logprob, rng = self.model.sample(request.sampling, rng, history, allowed)
        if constraint is not None:
            constraint.accept(token)
        top = tuple(self.model.top_logprobs(request.top_logprobs)) if request.top_logprobs else ()
        return TokenEvent(token, logprob, top), rng

    # -- sessions
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
        return self.sessions.forget(session_id, self.slots)

    def session_entries(self) -> list[dict]:
        return self.sessions.entries(self.slots)

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
