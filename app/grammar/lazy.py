"""A grammar that starts where the model starts a tool call (llama.cpp's "lazy grammars").

With tools offered and `tool_choice: "auto"` the model may answer in free text or call a tool.
Constraining the whole output would take that choice away; leaving all of it free lets a small
model write a call that names no tool, misses a required argument or invents keys. So the output
runs free until a trigger sees a call begin (the format's open tag, or a JSON object whose
"name" is one of the tools'); from there the call's grammar holds. The tokens the model already
wrote from the trigger's start are fed to the grammar first: if they do not fit it (a name the
tools do not have, a style the grammar does not take), the trigger is dropped and the output
stays free, for the tool parser to read as before.
"""

from __future__ import annotations

from typing import Protocol, Sequence, Union

from .compiler import Grammar, GrammarError, TokenMatcher


class Disarm:
    """A trigger's verdict: it can no longer fire in this output."""


DISARM = Disarm()


class Trigger(Protocol):
    def fire(self, tokens: list[int]) -> Union[tuple[Grammar, int], Disarm, None]:
        """After each output token: (the grammar, the index in `tokens` where its text begins)
        once a call has begun; DISARM when one cannot begin here any more; else None."""


class LazyGrammar:
    """A ConstraintSource (app/engine) whose matchers are free until one of `triggers` fires."""

    shapes_whole_output = False  # the output before a call is the model's own (it may think, too)

    def __init__(self, triggers: Sequence[Trigger]):
        self.triggers = tuple(triggers)

    def matcher(self) -> LazyMatcher:
        return LazyMatcher(self.triggers)


class LazyMatcher:
    def __init__(self, triggers: Sequence[Trigger]):
        self._armed = list(triggers)
        self._tokens: list[int] = []
        self._active: TokenMatcher | None = None

    @property
    def active(self) -> bool:
        return self._active is not None

    def allowed(self) -> bytes | None:
        return self._active.allowed() if self._active is not None else None

    def accept(self, token_id: int) -> None:
        if self._active is not None:
            self._active.accept(token_id)
            return
        self._tokens.append(token_id)
        for trigger in list(self._armed):
            verdict = trigger.fire(self._tokens)
            if verdict is None:
                continue
            self._armed.remove(trigger)
            if isinstance(verdict, Disarm):
                continue
            grammar, start = verdict
            matcher = grammar.matcher()
            try:
                for token in self._tokens[start:]:
                    matcher.accept(token)
            except GrammarError:  # what the model wrote is no call the grammar takes: left free
                continue
            self._active, self._armed = matcher, []
            return

    def valid_prefix(self, tokens: list[int]) -> int:
        return self._active.valid_prefix(tokens) if self._active is not None else len(tokens)

    def forced(self) -> list[int]:
        return self._active.forced() if self._active is not None else []

    @property
    def done(self) -> bool:
        return self._active is not None and self._active.done
