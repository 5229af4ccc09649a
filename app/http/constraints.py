"""The grammar a chat request's output must follow (any chat-like API's), from tool_choice and
response_format.

- tool_choice "required": one or more calls (one if parallel_tool_calls is false)
  to the offered tools; a named function: exactly one call to it.
- response_format json_object / json_schema: a JSON value (an object, or one that
  validates against the schema); with tools offered and tool_choice "auto", tool
  calls remain the alternative.
- tools offered with tool_choice "auto": the output is free until the model begins a call (the
  format's open tag, or a bare JSON call naming a tool); the call is then held to the tools'
  schemas (lazy_calls: app/grammar/lazy.py), as llama.cpp's lazy grammars do.
- otherwise no constraint: the output is free and the tool parser reads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Union

from app.grammar import DISARM, Grammar, GrammarCompiler, GrammarError, LazyGrammar, json_grammar, output_grammar
from app.grammar.lazy import Disarm
from app.text.tokenizer import Tokenizer
from app.tools import hermes
from app.tools.formats import json_call

from .errors import invalid_value

if TYPE_CHECKING:
    from .chat import ChatRequest


def output_constraint(request: ChatRequest, compiler: GrammarCompiler) -> Grammar | None:
    """The compiled grammar for `request`, None if its output is free; a 400 naming the
    parameter whose schema cannot be enforced."""
    tools = request.tools or []
    alternatives: list[dict[str, str]] = []
    if tools and request.tool_choice in ("required", "function"):
        if request.forced_tool is not None:
            chosen = [t for t in tools if t["function"]["name"] == request.forced_tool]
            alternatives.append(_checked(compiler, lambda: _calls(compiler, chosen, parallel=False), "tool_choice"))
        else:
            parallel = request.parallel_tool_calls
            alternatives.append(_checked(compiler, lambda: _calls(compiler, tools, parallel=parallel), "tools"))
    elif request.response_format is not None:
        if tools:
            parallel = request.parallel_tool_calls
            alternatives.append(_checked(compiler, lambda: _calls(compiler, tools, parallel=parallel), "tools"))
        schema_param = "response_format" if request.response_format.schema is None \
            else "response_format.json_schema.schema"
        alternatives.append(_checked(compiler, lambda: json_grammar(request.response_format.schema), schema_param))
    if not alternatives:
        return None
    return _compile(compiler, output_grammar(*alternatives), "response_format")


def _calls(compiler: GrammarCompiler, tools: list[dict[str, Any]], *, parallel: bool) -> dict[str, str]:
    return hermes.grammar(tools, parallel=parallel, open_tag=compiler.literal(hermes.OPEN),
                          close_tag=compiler.literal(hermes.CLOSE))


def _checked(compiler: GrammarCompiler, build: Callable[[], dict[str, str]], param: str) -> dict[str, str]:
    """The rules `build` writes, after compiling them alone, so an error (in writing them or in
    compiling them) names the parameter it came from."""
    try:
        rules = build()
    except GrammarError as e:
        raise invalid_value(param, f"'{param}' cannot be enforced: {e}") from None
    _compile(compiler, output_grammar(rules), param)
    return rules


def _compile(compiler: GrammarCompiler, lark: str, param: str) -> Grammar:
    try:
        return compiler.compile(lark)
    except GrammarError as e:
        raise invalid_value(param, f"'{param}' cannot be enforced: {e}") from None



def lazy_calls(request: ChatRequest, compiler: GrammarCompiler, tokenizer: Tokenizer) -> LazyGrammar | None:
    """For tools offered with tool_choice "auto" (and no response_format): a grammar that holds
    a call to the tools' schemas from where the model begins it. None when nothing is offered,
    or when a schema cannot be enforced (auto never refused one: that output stays free)."""
    tools = request.tools or []
    if not tools or request.tool_choice != "auto" or request.response_format is not None:
        return None
    try:
        tagged = compiler.compile(output_grammar(_calls(compiler, tools, parallel=request.parallel_tool_calls)))
        bare = compiler.compile(output_grammar(json_call.grammar(tools)))
    except GrammarError:
        return None
    names = [t["function"]["name"] for t in tools]
    return LazyGrammar([_OpenTag(tagged, compiler.token_id(hermes.OPEN), tokenizer), _BareCall(bare, names, tokenizer)])


_Verdict = Union[tuple[Grammar, int], Disarm, None]


class _OpenTag:
    """Fires where the model writes the format's open tag: one token (Qwen's `<tool_call>`), or
    several ending it (then from the token where it begins; a tag begun inside a token with other
    text is left free)."""

    def __init__(self, grammar: Grammar, token_id: int | None, tokenizer: Tokenizer):
        self.grammar, self.token_id, self.tokenizer = grammar, token_id, tokenizer

    def fire(self, tokens: list[int]) -> _Verdict:
        if self.token_id is not None:
            return (self.grammar, len(tokens) - 1) if tokens[-1] == self.token_id else None
        tail = tokens[-8:]
        if hermes.OPEN not in self.tokenizer.decode(tail):
            return None
        for k in range(len(tokens) - 1, len(tokens) - len(tail) - 1, -1):
            if self.tokenizer.decode(tokens[k:]).startswith(hermes.OPEN):
                return self.grammar, k
        return DISARM


class _BareCall:
    """Fires when the output opens with a bare (or fenced) JSON call that has named one of the
    tools: the grammar then takes the output from its first token and holds the arguments to that
    tool's schema. The name is the model's own: holding it to the tools would pick one the model
    did not mean, and run it (held from the name's first letter, Qwen 0.5B asked "What is 2+2?"
    called get_weather, and `get_news` became get_weather); a name no tool has stays text.
    Disarmed by anything else at the start, or after its first 32 tokens."""

    LIMIT = 32

    def __init__(self, grammar: Grammar, names: list[str], tokenizer: Tokenizer):
        self.grammar, self.names, self.tokenizer = grammar, names, tokenizer

    def fire(self, tokens: list[int]) -> _Verdict:
        if len(tokens) > self.LIMIT:
            return DISARM
        text = self.tokenizer.decode(tokens).lstrip()
        if not text:
            return None
        if text[0] not in "{`":
            return DISARM
        started = json_call.CALL_START.match(text)
        if started is None:
            return None  # ("{", "```js", '{"na': it may yet be one)
        name, closed = started.group(1), started.group(2)
        if closed:
            return (self.grammar, 0) if name in self.names else DISARM
        if any(n.startswith(name) for n in self.names):
            return None  # (the name is still being written)
        return DISARM
