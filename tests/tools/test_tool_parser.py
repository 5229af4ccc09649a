"""Tool-call parsing: recorded-style outputs, whole vs streamed, and the tools prompt."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.tools import (
    ContentDelta,
    StreamingToolParser,
    ToolArgumentsDelta,
    ToolCallStart,
    fold,
    parse_tool_calls,
    template_supports_tools,
    tools_system_prompt,
)

RECORDED = Path(__file__).parent / "recorded"
EXPECTED = json.loads((RECORDED / "expected.json").read_text(encoding="utf-8"))
TAGS = ("<tool_call>", "</tool_call>", "<function=")


def fn(name: str, properties: dict | None = None, description: str = "") -> dict:
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": {"type": "object", "properties": properties or {}}}}


TOOLS = [
    fn("get_weather", {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                       "days": {"type": "integer"}}, "Current weather for a city"),
    fn("search", {"query": {"type": "string"}}),
    fn("set_thermostat", {"temperature": {"type": "number"}, "eco": {"type": "boolean"}, "days": {"type": "integer"},
                          "schedule": {"type": "object"}, "rooms": {"type": "array", "items": {"type": "string"}},
                          "note": {"type": "string"}}),
    {"type": "function", "function": {"name": "log"}},  # no schema at all
]


def recorded(name: str) -> str:
    return (RECORDED / f"{name}.txt").read_text(encoding="utf-8")


def summary(parsed) -> tuple[str, list[tuple[str, str]]]:
    return parsed.content, [(c.name, c.arguments) for c in parsed.tool_calls]


def stream(text: str, cuts: list[int], tools=TOOLS, parallel=True):
    parser = StreamingToolParser(tools, parallel=parallel)
    points = sorted({c for c in cuts if 0 < c < len(text)})
    deltas = []
    for a, b in zip([0, *points], [*points, len(text)]):
        deltas += parser.push(text[a:b])
    deltas += parser.finish()
    return deltas


# ------------------------------------------------------------------------------------------- recorded outputs

@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recorded_whole(name):
    want = EXPECTED[name]
    got = parse_tool_calls(recorded(name), TOOLS)
    assert got.content == want["content"]
    assert [(c.name, c.arguments) for c in got.tool_calls] == [(c["name"], c["arguments"]) for c in want["calls"]]
    for call in got.tool_calls:
        assert re.fullmatch(r"call_[A-Za-z0-9]{24}", call.id)
        assert isinstance(json.loads(call.arguments), dict)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recorded_streamed_one_char_at_a_time(name):
    text = recorded(name)
    assert summary(fold(stream(text, list(range(len(text)))))) == summary(parse_tool_calls(text, TOOLS))


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(EXPECTED)), data=st.data())
def test_recorded_streamed_random_chunks(name, data):
    text = recorded(name)
    cuts = data.draw(st.lists(st.integers(0, max(len(text), 1)), max_size=30))
    deltas = stream(text, cuts)
    whole = parse_tool_calls(text, TOOLS)
    assert summary(fold(deltas)) == summary(whole)
    if not any(t in whole.content for t in TAGS):  # only an undeclared tool's call keeps its tags
        for d in deltas:
            if isinstance(d, ContentDelta):
                assert not any(t in d.text for t in TAGS), d
    _check_delta_shape(deltas)


def _check_delta_shape(deltas):
    """Start before arguments, indices 0.., no empty content deltas."""
    started = []
    for d in deltas:
        if isinstance(d, ToolCallStart):
            assert d.index == len(started)
            started.append(d.index)
        elif isinstance(d, ToolArgumentsDelta):
            assert d.index in started
        else:
            assert d.text


# Fuzz: random concatenations of the pieces these formats are made of, streamed in random chunks.
PIECES = [
    "<tool_call>", "</tool_call>", "<tool_", "</tool", "<function=get_weather>", "<function=nope>", "<function=",
    "</function>", "<parameter=city>", "<parameter=days>", "</parameter>", "```", "```json", "``", "`", "json",
    "\n", " ", "  \n", "{", "}", "[", "]", ",", ":", '"name"', '"get_weather"', '"arguments"', '"parameters"',
    '{"city": "Paris"}', '"3"', "3", "hello", "<", ">", "Paris",
    '{"name": "get_weather", "arguments": {"city": "Rome"}}', '{"name": "nope", "arguments": {}}',
    '[{"name": "search", "arguments": {"query": "x"}}]',
]


@settings(max_examples=400, deadline=None)
@given(pieces=st.lists(st.sampled_from(PIECES), max_size=14), data=st.data(), parallel=st.booleans())
def test_fuzz_stream_equals_whole(pieces, data, parallel):
    text = "".join(pieces)
    cuts = data.draw(st.lists(st.integers(0, max(len(text), 1)), max_size=20))
    deltas = stream(text, cuts, parallel=parallel)
    assert summary(fold(deltas)) == summary(parse_tool_calls(text, TOOLS, parallel=parallel))
    _check_delta_shape(deltas)


# ------------------------------------------------------------------------------------------- specific behaviour

def test_parallel_false_keeps_first_call_only():
    text = recorded("hermes_several")
    got = parse_tool_calls(text, TOOLS, parallel=False)
    assert [(c.name, json.loads(c.arguments)) for c in got.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert got.content == ""
    streamed = fold(stream(text, [5, 40, 90], parallel=False))
    assert summary(streamed) == summary(got)
    listed = parse_tool_calls(recorded("hermes_list_in_block"), TOOLS, parallel=False)
    assert [c.name for c in listed.tool_calls] == ["get_weather"]


def test_ids_are_unique():
    got = parse_tool_calls(recorded("hermes_several"), TOOLS)
    assert len({c.id for c in got.tool_calls}) == 2


def test_no_tools_means_plain_text():
    text = recorded("hermes_single")
    assert parse_tool_calls(text, []).content == text
    assert parse_tool_calls(text, None).tool_calls == []
    p = StreamingToolParser(None)
    assert p.push("<tool_") == [ContentDelta("<tool_")]
    assert p.finish() == []


def test_content_streams_early_and_holds_only_possible_markers():
    p = StreamingToolParser(TOOLS)
    assert p.push("The weather") == [ContentDelta("The weather")]
    assert p.push(" is <tool") == [ContentDelta(" is")]  # " " (trailing whitespace) and "<tool" held
    assert p.push("s> ok") == [ContentDelta(" <tools> ok")]
    assert p.push(" ``") == []
    assert p.push("`python\nx = 1") == [ContentDelta(" ```python\nx = 1")]
    assert p.finish() == []


def test_call_deltas_in_order():
    p = StreamingToolParser(TOOLS)
    out = p.push("Checking.\n<tool_call>\n{\"name\": \"get_weather\", ")
    assert out == [ContentDelta("Checking.")]
    out = p.push('"arguments": {"city": "Paris"}}\n</tool_call>')
    assert len(out) == 2 and isinstance(out[0], ToolCallStart) and out[0].name == "get_weather" and out[0].index == 0
    assert out[1] == ToolArgumentsDelta(0, '{"city": "Paris"}')
    assert p.finish() == []


def test_leading_brace_is_held_until_decided():
    p = StreamingToolParser(TOOLS)
    assert p.push("  {") == []
    assert p.push('"name": "get_weather", "arguments": {}}') == []  # could still be the whole output
    out = p.finish()
    assert [type(d) for d in out] == [ToolCallStart, ToolArgumentsDelta]
    p = StreamingToolParser(TOOLS)
    assert p.push("[1") == [ContentDelta("[1")]  # cannot start a list of calls
    p = StreamingToolParser(TOOLS)
    assert p.push('{"a": 1} and') == [ContentDelta('{"a": 1} and')]
    p = StreamingToolParser(TOOLS)
    assert p.push('{"note": Paris is lovely in spring') == [ContentDelta('{"note": Paris is lovely in spring')]
    p = StreamingToolParser(TOOLS)
    assert p.push('{"name": "get_weather", "arguments": {"days": 1.') == []  # 1.5 may follow


def test_arguments_string_holding_json_is_reserialized():
    got = parse_tool_calls('<tool_call>{"name": "search", "arguments": "{\\"query\\":\\"a\\"}"}</tool_call>', TOOLS)
    assert got.tool_calls[0].arguments == '{"query": "a"}'


def test_missing_arguments_is_empty_object():
    got = parse_tool_calls('<tool_call>{"name": "search"}</tool_call>', TOOLS)
    assert got.tool_calls[0].arguments == "{}"


def test_empty_list_arguments_is_empty_object():
    """Qwen 0.5B writes a call to a tool without parameters with `"arguments": []` (Codex's MCP test)."""
    for text in ('<tool_call>{"name": "search", "arguments": []}</tool_call>',
                 '```json\n{"name": "search", "arguments": []}\n```'):
        got = parse_tool_calls(text, TOOLS)
        assert [(c.name, c.arguments) for c in got.tool_calls] == [("search", "{}")], text
    assert not parse_tool_calls('<tool_call>{"name": "search", "arguments": [1]}</tool_call>', TOOLS).tool_calls


def test_mixed_block_with_undeclared_tool_stays_content():
    text = '<tool_call>[{"name": "search", "arguments": {}}, {"name": "nope", "arguments": {}}]</tool_call>'
    assert summary(parse_tool_calls(text, TOOLS)) == (text, [])


def test_a_name_off_only_in_case_calls_the_declared_tool():
    """opencode's Qwen 0.5B wrote `Write` for the declared `write`: the one tool that differs only in
    case is meant, and the call carries its declared name; two such tools leave it content."""
    for text in ('```json\n{"name": "Search", "arguments": {"query": "x"}}\n```',
                 '<tool_call>{"name": "SEARCH", "arguments": {"query": "x"}}</tool_call>',
                 '<function=Search><parameter=query>x</parameter></function>'):
        got = parse_tool_calls(text, TOOLS)
        assert [(c.name, json.loads(c.arguments)) for c in got.tool_calls] == [("search", {"query": "x"})], text
        streamed = StreamingToolParser(TOOLS)
        deltas = [d for piece in text for d in streamed.push(piece)] + list(streamed.finish())
        assert [d.name for d in deltas if isinstance(d, ToolCallStart)] == ["search"], text
    # the XML form's values are coerced by the declared tool's schema
    text = "<function=Get_Weather><parameter=city>Oslo</parameter><parameter=days>3</parameter></function>"
    assert [(c.name, json.loads(c.arguments)) for c in parse_tool_calls(text, TOOLS).tool_calls] == [
        ("get_weather", {"city": "Oslo", "days": 3})]
    ambiguous = [fn("search"), fn("Search")]
    text = '<tool_call>{"name": "SEARCH", "arguments": {}}</tool_call>'
    assert summary(parse_tool_calls(text, ambiguous)) == (text, [])


def test_xml_coercion_fallbacks():
    text = ("<function=set_thermostat><parameter=temperature>warm</parameter><parameter=eco>False</parameter>"
            "<parameter=days>4.0</parameter><parameter=schedule>{'mon': [7]}</parameter>"
            "<parameter=note>42</parameter></function>")
    args = json.loads(parse_tool_calls(text, TOOLS).tool_calls[0].arguments)
    assert args == {"temperature": "warm", "eco": False, "days": 4, "schedule": {"mon": [7]}, "note": "42"}


def test_xml_unclosed_parameter_ends_at_next():
    text = "<function=get_weather><parameter=city>Paris<parameter=days>2</function>"
    assert json.loads(parse_tool_calls(text, TOOLS).tool_calls[0].arguments) == {"city": "Paris", "days": 2}


def test_bare_json_only_when_whole_output():
    text = 'Call: {"name": "get_weather", "arguments": {"city": "Paris"}}'
    assert summary(parse_tool_calls(text, TOOLS)) == (text, [])
    text = '{"name": "get_weather", "arguments": {"city": "Paris"}} done'
    assert summary(parse_tool_calls(text, TOOLS)) == (text, [])


def test_bare_tool_list_format_accepted():
    tools = [{"name": "get_weather", "parameters": {"type": "object", "properties": {}}}]
    assert parse_tool_calls(recorded("bare_json"), tools).tool_calls[0].name == "get_weather"


# ------------------------------------------------------------------------------------------- prompt helpers

def test_tools_system_prompt_lists_tools_and_format():
    text = tools_system_prompt(TOOLS)
    assert "<tool_call>" in text and '"arguments"' in text
    for name in ("get_weather", "search", "set_thermostat", "log"):
        assert f'"name": "{name}"' in text
    assert "Current weather for a city" in text and '"enum": ["celsius", "fahrenheit"]' in text
    # the format it asks for is the format we parse
    listed = [json.loads(line) for line in text.split("<tools>\n")[1].split("\n</tools>")[0].splitlines()]
    assert [t["function"]["name"] for t in listed] == ["get_weather", "search", "set_thermostat", "log"]


@pytest.mark.parametrize("source, expected", [
    ("{% for message in messages %}{{ message['content'] }}{% endfor %}", False),
    ("{%- if tools %}{{ tools | tojson }}{% endif %}", True),
    ("{% for tool in tools %}{{ tool }}{% endfor %}", True),
    ("You can use tools. {{ messages[0]['content'] }}", False),  # plain text, not code
    ("{{ 'no tools here' }}", False),  # a string literal
    ("{%- if messages[0]['role'] == 'system' %}{% set t = tools_list %}{% endif %}", False),
    ("", False),
])
def test_template_supports_tools(source, expected):
    assert template_supports_tools(source) is expected


# ------------------------------------------------------------------------------------------- found by fuzzing

NOT_JSON_ARGUMENTS = ['{"query": NaN}', '{"query": Infinity}', '{"query": -Infinity}', '{"query": 1e400}']


@pytest.mark.parametrize("arguments", NOT_JSON_ARGUMENTS)
@pytest.mark.parametrize("shape", ["tool_call", "fence", "bare"])
def test_a_call_whose_arguments_are_not_strict_json_is_no_call(arguments, shape):
    """NaN, Infinity and 1e400 (which Python's json reads as inf) made arguments such as
    '{"a": Infinity}', which clients' JSON parsers refuse and our own 400 when the assistant turn
    came back; such output stays content, in whole and streamed parsing alike."""
    call = f'{{"name": "search", "arguments": {arguments}}}'
    text = {"tool_call": f"<tool_call>\n{call}\n</tool_call>", "fence": f"```json\n{call}\n```", "bare": call}[shape]
    whole = parse_tool_calls(text, TOOLS)
    # a malformed <tool_call> block is dropped, as any is; an untagged one is the text it was
    assert whole.tool_calls == [] and whole.content == ("" if shape == "tool_call" else text)
    assert summary(fold(stream(text, list(range(0, len(text), 3))))) == summary(whole)


@pytest.mark.parametrize("shape", ["tool_call", "fence", "bare"])
def test_a_call_nested_past_the_depth_limit_is_no_call_and_no_crash(shape):
    deep = "[" * 3000 + "]" * 3000
    call = f'{{"name": "search", "arguments": {{"query": {deep}}}}}'
    text = {"tool_call": f"<tool_call>\n{call}\n</tool_call>", "fence": f"```json\n{call}\n```", "bare": call}[shape]
    assert parse_tool_calls(text, TOOLS).tool_calls == []
    fold(stream(text, [len(text) // 2]))


def test_qwen_xml_parameters_survive_a_broken_schema_and_huge_integers():
    """A client's anyOf/oneOf that is not a list, and a 5,000-digit integer for an integer
    parameter: the call is still parsed (the value kept as text), no TypeError or ValueError."""
    tools = [fn("f", {"p": {"anyOf": 5}, "q": {"oneOf": True}, "n": {"type": "integer"}})]
    digits = "9" * 5000
    text = (f"<tool_call>\n<function=f>\n<parameter=p>\n1\n</parameter>\n<parameter=q>\nx\n</parameter>\n"
            f"<parameter=n>\n{digits}\n</parameter>\n</function>\n</tool_call>")
    (call,) = parse_tool_calls(text, tools).tool_calls
    args = json.loads(call.arguments)
    assert args["p"] == 1 and args["q"] == "x" and args["n"] == digits


@pytest.mark.parametrize("tail", ["<", "<tool", "<tool_call", "</tool_"])
def test_a_marker_begun_at_a_cut_end_is_dropped(tail):
    """Output cut short (max_tokens) right inside a marker: the marker's first characters are
    unfinished markup, dropped as an unfinished block is; at a natural end they stay content."""
    text = "Let me check. " + tail
    assert parse_tool_calls(text, TOOLS, cut=True).content == "Let me check. "
    assert parse_tool_calls(text, TOOLS).content == text
    for cuts in ([], [3], [len(text) - 2]):
        parser = StreamingToolParser(TOOLS)
        deltas = []
        for a, b in zip([0, *cuts], [*cuts, len(text)]):
            deltas += parser.push(text[a:b])
        assert fold(deltas + parser.finish(cut=True)).content == "Let me check. "
    assert parse_tool_calls("a < b", TOOLS, cut=True).content == "a < b"  # not at the end: prose
