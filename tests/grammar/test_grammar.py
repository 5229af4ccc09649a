"""Grammars compiled over the test model's real tokenizer: what the token masks allow."""

from __future__ import annotations

import json

import pytest

from app.grammar import GrammarCompiler, GrammarError, json_grammar, output_grammar
from app.tools.formats.hermes import grammar as tool_calls_grammar
from app.text.tokenizer import Tokenizer

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}


@pytest.fixture(scope="module")
def tokenizer(model_dir) -> Tokenizer:
    return Tokenizer.from_dir(model_dir)


@pytest.fixture(scope="module")
def compiler(model_dir, tokenizer) -> GrammarCompiler:
    return GrammarCompiler.from_file(model_dir / "tokenizer.json", tokenizer.vocab_size, tokenizer.eos_token_ids)


def allows(mask: bytes, token: int) -> bool:
    word = int.from_bytes(mask[4 * (token // 32): 4 * (token // 32) + 4], "little")
    return bool(word >> (token % 32) & 1)


def walk(compiler, tokenizer, lark: str, text: str) -> tuple[bool, object]:
    """Feed `text`'s tokens through a fresh matcher, checking each against the mask first."""
    matcher = compiler.compile(lark).matcher()
    for token in tokenizer.encode(text):
        if not allows(matcher.allowed(), token):
            return False, matcher
        matcher.accept(token)
    return True, matcher


def test_a_declared_call_is_allowed_token_by_token_and_then_only_end_of_turn(compiler, tokenizer):
    lark = output_grammar(tool_calls_grammar([WEATHER, TIME], parallel=False))
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
    ok, matcher = walk(compiler, tokenizer, lark, call)
    assert ok
    mask = matcher.allowed()
    allowed = [t for t in range(tokenizer.vocab_size) if allows(mask, t)]
    newline = tokenizer.encode("\n")
    assert set(allowed) <= set(tokenizer.eos_token_ids) | set(newline)
    assert set(tokenizer.eos_token_ids) & set(allowed)


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "get_news", "arguments": {}}\n</tool_call>',  # undeclared tool
    '<tool_call>\n{"name": "get_weather", "arguments": {"days": 2}}\n</tool_call>',  # misses a required argument
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": 3}}\n</tool_call>',  # wrong type
    'Sure! <tool_call>',  # text before the call
])
def test_calls_that_break_the_schema_are_masked_out(compiler, tokenizer, text):
    ok, _ = walk(compiler, tokenizer, output_grammar(tool_calls_grammar([WEATHER, TIME], parallel=True)), text)
    assert not ok


def test_parallel_calls_only_when_asked(compiler, tokenizer):
    two = ('<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>\n'
           '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
    assert walk(compiler, tokenizer, output_grammar(tool_calls_grammar([WEATHER, TIME], parallel=True)), two)[0]
    assert not walk(compiler, tokenizer, output_grammar(tool_calls_grammar([WEATHER, TIME], parallel=False)), two)[0]


def test_json_schema_and_its_alternative(compiler, tokenizer):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    only_json = output_grammar(json_grammar(schema))
    assert walk(compiler, tokenizer, only_json, json.dumps({"n": 7}))[0]
    assert not walk(compiler, tokenizer, only_json, json.dumps({"n": 12}))[0]
    assert not walk(compiler, tokenizer, only_json, json.dumps({"n": 7, "m": 1}))[0]
    either = output_grammar(tool_calls_grammar([TIME], parallel=False), json_grammar(schema))
    assert walk(compiler, tokenizer, either, json.dumps({"n": 3}))[0]
    assert walk(compiler, tokenizer, either,
                '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>')[0]


def test_any_json_object(compiler, tokenizer):
    lark = output_grammar(json_grammar(None))
    assert walk(compiler, tokenizer, lark, '{"a": [1, 2, {"b": null}], "c": "d"}')[0]
    assert not walk(compiler, tokenizer, lark, '[1, 2]')[0]


@pytest.mark.parametrize("schema, named", [
    ({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}, "if"),
    ({"type": "string", "format": "no-such-format"}, "no-such-format"),
])
def test_schema_features_that_cannot_be_enforced_are_errors(compiler, schema, named):
    with pytest.raises(GrammarError, match=named):
        compiler.compile(output_grammar(json_grammar(schema)))


# Valid schemas that closing every object with properties would make unsatisfiable (a key only
# a branch, a $defs part or a const holds), each with an instance it must still allow.
MIXINS = [
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]}, {"b": 1}),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"],
      "anyOf": [{"properties": {"b": {"type": "integer"}}, "required": ["b"]}]}, {"a": "x", "b": 2}),
    ({"$defs": {"base": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}},
      "allOf": [{"$ref": "#/$defs/base"}, {"type": "object", "properties": {"b": {"type": "integer"}},
                                           "required": ["b"]}]}, {"a": "x", "b": 2}),
    ({"const": {"a": 1, "b": 2}, "properties": {"a": {}}}, {"a": 1, "b": 2}),
]


@pytest.mark.parametrize("schema, instance", MIXINS)
def test_closing_objects_keeps_every_valid_schema_satisfiable(compiler, tokenizer, schema, instance):
    ok, _ = walk(compiler, tokenizer, output_grammar(json_grammar(schema)), json.dumps(instance))
    assert ok


def test_closed_objects_refuse_invented_keys_where_the_schema_is_a_plain_object(compiler, tokenizer):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    lark = output_grammar(json_grammar(schema))
    assert walk(compiler, tokenizer, lark, '{"city": "Paris"}')[0]
    assert not walk(compiler, tokenizer, lark, '{"city": "Paris", "required": ["city"]}')[0]


def test_tool_parameters_with_defs_and_refs_are_enforced(compiler, tokenizer):
    """pydantic writes nested models as $defs and #/$defs refs: they resolve inside a call."""
    tool = {"type": "function", "function": {"name": "where", "parameters": {
        "type": "object", "$defs": {"Loc": {"type": "object", "properties": {"city": {"type": "string"}},
                                            "required": ["city"]}},
        "properties": {"loc": {"$ref": "#/$defs/Loc"}}, "required": ["loc"]}}}
    lark = output_grammar(tool_calls_grammar([tool, TIME], parallel=False))
    call = '<tool_call>\n{"name": "where", "arguments": {"loc": {"city": "Paris"}}}\n</tool_call>'
    assert walk(compiler, tokenizer, lark, call)[0]
    bad = '<tool_call>\n{"name": "where", "arguments": {"loc": {"town": "Paris"}}}\n</tool_call>'
    assert not walk(compiler, tokenizer, lark, bad)[0]


def test_an_x_guidance_that_is_no_object_is_a_grammar_error():
    with pytest.raises(GrammarError):
        json_grammar({"type": "object", "x-guidance": "abc"})


# --- lazy tool-call grammars (tool_choice "auto") ------------------------------------------

LAZY_TOOLS = [{"type": "function", "function": {"name": "set_fan", "parameters": {
    "type": "object", "properties": {"level": {"type": "integer"}, "mode": {"type": "string", "enum": ["eco", "turbo"]}},
    "required": ["level", "mode"]}}}]


def _lazy(compiler, tokenizer):
    from app.http.chat import ChatRequest
    from app.http.constraints import lazy_calls
    from app.engine import SamplingParams
    from app.http.generation_params import GenerationParams
    params = GenerationParams(sampling=SamplingParams(), max_tokens=None, stop=())
    request = ChatRequest(model=None, messages=[], params=params, stream=False, include_usage=False,
                          tools=LAZY_TOOLS, parallel_tool_calls=True, tool_choice="auto", forced_tool=None,
                          response_format=None, logprobs=False, top_logprobs=0, n=1, template_kwargs={})
    return lazy_calls(request, compiler, tokenizer)


def _feed(matcher, tokenizer, text: str) -> None:
    for token in tokenizer.encode(text):
        matcher.accept(token)


@pytest.mark.parametrize("text, held", [
    ("Sure, here you go.", False),                                   # prose: never held
    ('{"answer": 42}', False),                                       # another object
    ('{"name": "Write", "arguments": {', False),                     # a name no tool has: text
    ('{"name": "set_fan", "arguments": {"level": 3', True),          # a tool's: held
    ('```json\n{\n  "name": "set_fan",\n  "arguments": {\n    "level": 3', True),  # fenced, pretty
    ("<tool_call>\n", True),                                         # the format's open tag
])
def test_a_lazy_grammar_holds_only_a_begun_call(compiler, tokenizer, text, held):
    matcher = _lazy(compiler, tokenizer).matcher()
    assert matcher.allowed() is None
    _feed(matcher, tokenizer, text)
    assert matcher.active is held
    if held:  # from here the schema holds: an invented key or a mode outside the enum is refused
        with pytest.raises(GrammarError):
            _feed(matcher, tokenizer, ', "speed": 1')
    else:
        assert matcher.allowed() is None


def test_the_same_grammar_compiles_once_and_its_verdict_is_kept(model_dir, tokenizer):
    """An agent sends the same tools with every request: their grammar is validated once (the
    same Grammar comes back), an unenforceable one is refused every time, and only the last
    CACHED grammars are kept."""
    compiler = GrammarCompiler.from_file(model_dir / "tokenizer.json", tokenizer.vocab_size, tokenizer.eos_token_ids)
    lark = output_grammar(tool_calls_grammar([WEATHER, TIME], parallel=False))
    first = compiler.compile(lark)
    assert compiler.compile(lark) is first
    assert walk(compiler, tokenizer, lark, '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>')[0]
    bad = output_grammar(json_grammar({"type": "string", "pattern": "(?=a)b"}))
    for _ in range(2):
        with pytest.raises(GrammarError):
            compiler.compile(bad)
    for n in range(GrammarCompiler.CACHED):
        compiler.compile(output_grammar(json_grammar({"type": "string", "maxLength": n + 1})))
    assert compiler.compile(lark) is not first  # pushed out by as many newer ones
