"""The grammar a chat request's output must follow (any chat-like API's), from tool_choice and
response_format.

- tool_choice "required": one or more calls (one if parallel_tool_calls is false)
  to the offered tools; a named function: exactly one call to it.
- response_format json_object / json_schema: a JSON value (an object, or one that
  validates against the schema); with tools offered and tool_choice "auto", tool
  calls remain the alternative.
- otherwise no constraint: the output is free and the tool parser reads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from app.grammar import Grammar, GrammarCompiler, GrammarError, json_grammar, output_grammar
from app.tools import hermes

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

