"""ChatTemplate vs transformers' apply_chat_template, plus sandbox behaviour."""

from __future__ import annotations

import re

import pytest

from app.text.chat_template import ChatTemplate, TemplateError

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Météo actuelle — current weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}

CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello!"}],
    "system_user": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Write a haiku about 🌍."},
    ],
    "multi_turn": [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 你好 in English?"},
    ],
    "whitespace": [{"role": "user", "content": "  line1\n\n\tline2  "}],
}

TOOL_CONVERSATIONS = {
    "tool_call": [
        {"role": "user", "content": "Weather in Zürich?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}
            ],
        },
        {"role": "tool", "content": '{"temp": 21}'},
        {"role": "tool", "content": '{"temp": 22}'},
        {"role": "assistant", "content": "21 °C."},
        {"role": "user", "content": "Thanks"},
    ],
    "system_tools": [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris?"},
    ],
}


def template_for(tok) -> ChatTemplate:
    return ChatTemplate(tok.chat_template, tok.bos_token, tok.eos_token)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conv", list(CONVERSATIONS))
def test_matches_transformers(tok, ref, conv, add_generation_prompt):
    messages = CONVERSATIONS[conv]
    got = template_for(tok).render(messages, add_generation_prompt=add_generation_prompt)
    want = ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert got == want


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conv", [*CONVERSATIONS, *TOOL_CONVERSATIONS])
def test_matches_transformers_with_tools(tok, ref, conv, add_generation_prompt):
    messages = {**CONVERSATIONS, **TOOL_CONVERSATIONS}[conv]
    kw = dict(tools=[WEATHER_TOOL], add_generation_prompt=add_generation_prompt)
    got = template_for(tok).render(messages, **kw)
    assert got == ref.apply_chat_template(messages, tokenize=False, **kw)


def test_qwen_tools_rendered(load_tok):
    tok = load_tok("qwen")
    out = template_for(tok).render(TOOL_CONVERSATIONS["tool_call"], tools=[WEATHER_TOOL])
    assert "<tools>\n" + '{"type": "function", "function": {"name": "get_weather"' in out
    assert "Météo" in out  # tojson keeps non-ASCII
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>' in out
    assert out.endswith("<|im_start|>assistant\n")


def test_raise_exception():
    t = ChatTemplate(
        "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}ok"
    )
    assert t.render([{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(TemplateError, match="^Conversation must start with user$"):
        t.render([{"role": "assistant", "content": "x"}])


def test_variables_and_filters():
    src = (
        "{{ bos_token }}{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
        "{{ m | tojson }}|{% endfor %}{{ tools | tojson(indent=2) }}{{ add_generation_prompt }}"
        "{{ custom }}{% generation %}G{% endgeneration %}{{ eos_token }}"
    )
    msgs = [{"role": "user", "content": "é", "z": 1}, {"a": 1}, {"b": 2}]
    out = ChatTemplate(src, bos_token="<s>", eos_token="</s>").render(
        msgs, tools=[{"x": [1]}], add_generation_prompt=False, custom="C"
    )
    tools_json = '[\n  {\n    "x": [\n      1\n    ]\n  }\n]'
    assert out == '<s>{"role": "user", "content": "é", "z": 1}|{"a": 1}|' + tools_json + "FalseCG</s>"


def test_trim_and_lstrip_blocks():
    src = "{% for m in messages %}\n    {% if true %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}"
    assert ChatTemplate(src).render([{"content": "a"}, {"content": "b"}]) == "a\nb\n"


def test_strftime_now():
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", ChatTemplate("{{ strftime_now('%Y-%m-%d') }}").render([]))


def test_undefined_tokens_render_empty():
    assert ChatTemplate("[{{ bos_token }}]").render([]) == "[]"


@pytest.mark.parametrize(
    "src",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__ }}",
        "{{ messages.__class__.__base__.__subclasses__() }}",
        "{{ raise_exception.__globals__ }}",
        "{{ cycler.__init__.__globals__.os }}",
        "{{ lipsum.__globals__['os'].popen('id').read() }}",
        "{% set x = messages.append(1) %}",
        "{{ messages[0].update({'a': 1}) }}",
        "{{ ().__class__.__bases__[0].__subclasses__() }}",
        "{{ self._TemplateReference__context }}",
    ],
)
def test_sandbox_blocks_attacks(src):
    messages = [{"role": "user", "content": "x"}]
    with pytest.raises(TemplateError, match="^chat template error: "):
        ChatTemplate(src).render(messages)
    assert messages == [{"role": "user", "content": "x"}]


def test_cannot_include_files():
    with pytest.raises(TemplateError):
        ChatTemplate("{% include '/etc/passwd' %}").render([])
    with pytest.raises(TemplateError):
        ChatTemplate("{% import '/etc/passwd' as x %}").render([])


def test_syntax_error_at_compile():
    with pytest.raises(TemplateError, match="^chat template error: "):
        ChatTemplate("{% for m in messages %}")


def test_python_errors_wrapped():
    with pytest.raises(TemplateError, match="^chat template error: "):
        ChatTemplate("{{ 'a' + messages[0].content }}").render([{"content": None}])


def test_compiled_once_render_many():
    t = ChatTemplate("{{ messages | length }}")
    assert [t.render([{}] * n) for n in range(3)] == ["0", "1", "2"]
