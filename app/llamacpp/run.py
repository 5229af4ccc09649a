"""Running a llama.cpp-route request (/completion, /infill): its prompts times `n_cmpl` choices,
one after another on the engine, answered in llama.cpp's shapes.

A whole answer is one result object (or, for several prompts or `n_cmpl` > 1, an array of them,
as llama.cpp answers); a stream sends `data: {content, tokens, stop: false}` chunks and, per
choice, a last chunk with `stop: true` and the statistics (llama.cpp's stream has no `[DONE]`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Iterator

from app.engine import CancelToken, GenerationRequest, GenerationStats
from app.http.planning import choice_generation, plan_generation, timings
from app.model_host import ServedModel
from app.output import ChoicePipeline, OutputOptions, PromptProgress

from .params import LlamaParams, pick_fields

# our finish reason -> llama.cpp's stop_type
_STOP_TYPE = {"stop": "eos", "length": "limit", "cancelled": "none"}


def stop_type(finish_reason: str | None, stop_sequence: str | None, indent_stopped: bool = False) -> str:
    """llama.cpp's stop_type; its n_indent end is a "limit" there too."""
    if indent_stopped:
        return "limit"
    return "word" if stop_sequence else _STOP_TYPE.get(finish_reason or "", "none")


@dataclass(frozen=True)
class Task:
    """One prompt of a request, ready for the engine."""
    generation: GenerationRequest
    truncated: bool = False  # the prompt was cut to fit the context
    prompt: str | None = None  # its text, for /completion's `prompt` field


def plan(model: ServedModel, tokens: list[int], llama: LlamaParams, *, param: str,
         session_id: str | None) -> GenerationRequest:
    """The engine request: n_predict tokens at most, cut to the room the prompt leaves (llama.cpp
    ends such a generation at the context's end, it does not refuse it); -1: all that room;
    0: one token, which the caller does not keep (the prompt is read into the cache)."""
    wanted = 1 if llama.n_predict == 0 else llama.params.max_tokens
    request = plan_generation(model, tokens, replace(llama.params, max_tokens=None), param=param,
                              default_max_tokens=wanted, session_id=session_id)
    return request if llama.cache_prompt else replace(request, reuse_prefix=False)


class _Deadline:
    """llama.cpp's t_max_predict_ms as a cancel token for one choice: set once the time has passed
    since the first token and a newline has been written; the request's own token still counts."""

    def __init__(self, parent: CancelToken, limit_ms: int):
        self.parent = parent
        self.limit_s = limit_ms / 1000
        self.first: float | None = None
        self.newline = False
        self.fired = False
        self.token = CancelToken(probe=self._expired)
        self.token.generations = parent.generations  # the request's log line counts this generation

    def saw(self, text: str) -> None:
        if self.first is None:
            self.first = time.perf_counter()
        self.newline = self.newline or "\n" in text

    def _expired(self) -> bool:
        if self.parent.cancelled:
            return True
        if self.newline and self.first is not None and time.perf_counter() - self.first > self.limit_s:
            self.fired = True
        return self.fired


class Choice:
    """One generation: iterate for (text, token ids) pieces; afterwards the result is final."""

    def __init__(self, run: "LlamaRun", index: int, task: Task, generation: GenerationRequest, cancel: CancelToken):
        self.run, self.index, self.task, self.generation, self.cancel = run, index, task, generation, cancel
        self.content: list[str] = []
        self.tokens: list[int] = []
        self.stats = GenerationStats()
        self.stop_type = "none"
        self.stopping_word = ""
        self.cancelled = False
        self._live: ChoicePipeline | None = None

    @property
    def slot(self) -> int:
        """The sequence slot it runs (ran) in: llama.cpp's id_slot."""
        stats = self._live.stats if self._live is not None else self.stats
        return stats.slot or 0

    def __iter__(self) -> Iterator[tuple[str, list[int]]]:
        model = self.run.model
        if self.run.llama.n_predict == 0:  # fill the cache with the prompt; the token it yields is not kept
            generation = model.engine.generate(replace(self.generation, max_tokens=1), self.cancel)
            for _ in generation:
                pass
            self.stats = replace(generation.stats, completion_tokens=0, decode_ms=0.0)
            self.cancelled = generation.stats.finish_reason == "cancelled"
            self.stop_type = "limit"
            return
        deadline = _Deadline(self.cancel, self.run.llama.t_max_predict_ms) if self.run.llama.t_max_predict_ms else None
        pipeline = ChoicePipeline(model.engine.generate(self.generation, deadline.token if deadline else self.cancel),
                                  model.tokenizer, self.run.options)
        self._live = pipeline
        seen = 0
        for delta in pipeline:
            if isinstance(delta, PromptProgress):
                continue
            ids = self._ids(pipeline.events[seen:])
            seen = len(pipeline.events)
            if deadline is not None:
                deadline.saw(delta.text)
            self.content.append(delta.text)
            self.tokens += ids
            yield delta.text, ids
        tail = self._ids(pipeline.events[seen:])  # tokens whose text was held back (a stop string) or is none
        self.tokens += tail
        if tail:
            yield "", tail
        self.stats = pipeline.stats
        if deadline is not None and deadline.fired and not self.cancel.cancelled:
            self.stop_type = "limit"  # llama.cpp's t_max_predict_ms ends a choice as a limit
        elif pipeline.cancelled:
            self.cancelled = True
        else:
            self.stop_type = stop_type(pipeline.finish_reason, pipeline.stop_sequence, pipeline.indent_stopped)
            self.stopping_word = pipeline.stop_sequence or ""

    def _ids(self, events) -> list[int]:
        return [e.token_id for e in events if e.token_id not in self.generation.stop_token_ids]

    def result(self, *, streamed: bool = False) -> dict[str, Any]:
        """The whole answer, or (`streamed`: the text went out in chunks already) a stream's last chunk."""
        content = "".join(self.content)
        out = {
            "index": self.index,
            "content": "" if streamed else content,
            "tokens": [] if streamed or not self.run.llama.return_tokens else self.tokens,
            "id_slot": self.slot,
            "stop": True,
            "model": self.run.model.id,
            "tokens_predicted": self.stats.completion_tokens,
            "tokens_evaluated": self.stats.prompt_tokens,
            "generation_settings": self.run.generation_settings(self.generation),
            "has_new_line": "\n" in content,
            "truncated": self.task.truncated,
            "stop_type": self.stop_type,
            "stopping_word": self.stopping_word,
            "tokens_cached": self.stats.cached_tokens,
            "timings": timings(self.stats),
        }
        if self.task.prompt is not None:
            out["prompt"] = self.task.prompt
        return pick_fields(out, self.run.llama.response_fields)


class LlamaRun:
    def __init__(self, model: ServedModel, llama: LlamaParams, tasks: list[Task], options: OutputOptions):
        self.model, self.llama, self.tasks, self.options = model, llama, tasks, options

    def choices(self, cancel: CancelToken) -> Iterator[Choice]:
        n = self.llama.n_cmpl
        for p, task in enumerate(self.tasks):
            for j in range(n):
                yield Choice(self, p * n + j, task, choice_generation(task.generation, j), cancel)

    def generation_settings(self, generation: GenerationRequest) -> dict[str, Any]:
        s = generation.sampling
        return {
            "n_ctx": self.model.context_length,
            "n_predict": self.llama.n_predict,
            "max_tokens": generation.max_tokens if self.llama.n_predict != 0 else 0,
            "temperature": s.temperature,
            "top_k": s.top_k,
            "top_p": s.top_p,
            "min_p": s.min_p,
            "repeat_penalty": s.repetition_penalty,
            "presence_penalty": s.presence_penalty,
            "frequency_penalty": s.frequency_penalty,
            "seed": s.seed if s.seed is not None else 0xFFFFFFFF,
            "stop": list(self.llama.params.stop),
            "n_indent": self.llama.n_indent,
            "n_cmpl": self.llama.n_cmpl,
            "t_max_predict_ms": self.llama.t_max_predict_ms,
            "samplers": list(self.llama.samplers) if self.llama.samplers is not None
            else ["penalties", "top_k", "top_p", "min_p", "temperature"],
            "stream": self.llama.stream,
            "model": self.model.id,
        }

    def complete(self, cancel: CancelToken) -> dict[str, Any] | list[dict[str, Any]]:
        results = []
        for choice in self.choices(cancel):
            for _ in choice:
                pass
            results.append(choice.result())
        return results[0] if len(results) == 1 else results

    def stream(self, cancel: CancelToken) -> Iterator[dict[str, Any]]:
        for choice in self.choices(cancel):
            for text, ids in choice:
                if text or ids:
                    yield {"index": choice.index, "content": text, "tokens": ids, "stop": False, "id_slot": choice.slot}
            if choice.cancelled:
                return
            yield choice.result(streamed=True)
