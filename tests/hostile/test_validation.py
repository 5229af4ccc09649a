"""The shared validation layer (app/validation.py) on its own, and through each API's parser."""

from __future__ import annotations

import json

import pytest

from app import validation
from app.anthropic.protocol import parse_messages_request
from app.openai.chat.protocol import parse_chat_request
from app.http.errors import APIError, to_api_error
from app.openai.responses.protocol import parse_responses_request
from app.tools.coerce import _json_or_python

DEEP = "[" * 10_000 + "]" * 10_000


@pytest.mark.parametrize("text", [DEEP, "[" * 65 + "]" * 65, '{"a": 1e400}', "[NaN]", "-Infinity", "9" * 5000,
                                  '{"a": ', ""])
def test_loads_refuses_with_invalid_input(text):
    with pytest.raises(validation.InvalidInput) as e:
        validation.loads(text, param="p")
    assert e.value.param == "p"
    assert to_api_error(e.value).status == 400


def test_loads_takes_what_is_in_bounds():
    assert validation.loads("[" * 64 + "]" * 64) is not None
    assert validation.loads('{"a": 1.5e300, "b": [1, 2]}') == {"a": 1.5e300, "b": [1, 2]}
    assert validation.try_loads(DEEP) == (False, None)
    assert validation.try_loads('{"a": 1}') == (True, {"a": 1})


def test_loads_bounds_characters():
    with pytest.raises(validation.InvalidInput):
        validation.loads('"' + "a" * 100 + '"', max_chars=50)


def _history(arguments):
    return {"messages": [{"role": "user", "content": "x"},
                         {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                               "function": {"name": "f", "arguments": arguments}}]}]}


@pytest.mark.parametrize("arguments", [DEEP, '{"a": 1e999}', "[1]", 5, '"s"'])
def test_chat_tool_call_arguments(arguments):
    with pytest.raises((APIError, validation.InvalidInput)) as e:
        parse_chat_request(_history(arguments))
    assert to_api_error(e.value).status == 400
    assert "tool_calls[0].function.arguments" in (to_api_error(e.value).param or "")


def test_chat_tool_call_arguments_as_object_or_string():
    for arguments in ('{"city": "Paris"}', {"city": "Paris"}):
        request = parse_chat_request(_history(arguments))
        assert request.messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}


def test_responses_function_call_arguments_deep():
    body = {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": DEEP}]}
    with pytest.raises(validation.InvalidInput) as e:
        parse_responses_request(body)
    assert e.value.param == "input[0].arguments"


def test_anthropic_user_id_deep_is_just_a_user_id():
    body = {"max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "metadata": {"user_id": DEEP}}
    assert parse_messages_request(body).session_id is None
    uid = json.dumps({"session_id": "abc-123", "device_id": "d"})
    body["metadata"]["user_id"] = uid
    assert parse_messages_request(body).session_id == "abc-123"


@pytest.mark.parametrize("name", ["messages", "tools", "add_generation_prompt", "eos_token"])
def test_template_kwargs_cannot_replace_what_the_server_sets(name):
    with pytest.raises(APIError):
        parse_chat_request({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {name: 1}})


def test_model_output_too_deep_is_not_a_value():
    from app.tools.coerce import _FAIL
    assert _json_or_python("[" * 5000 + "]" * 5000) is _FAIL  # refused, no RecursionError


def test_logged_tool_type_sets_stay_bounded():
    """Each unknown tool type is logged once; a client sending endless new ones grows nothing."""
    from app.anthropic import protocol as anthropic_protocol
    from app.openai.responses import protocol as responses_protocol

    for i in range(500):
        parse_messages_request({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}],
                                "tools": [{"type": f"server_tool_{i}" + "x" * 1000}]})
        parse_responses_request({"input": "x", "tools": [{"type": f"hosted_{i}" + "y" * 1000}]})
    assert len(anthropic_protocol._logged_server_tools) <= anthropic_protocol.MAX_LOGGED_TOOL_TYPES
    assert len(responses_protocol._logged_tool_types) <= 64
    assert all(len(k) <= 64 for k in anthropic_protocol._logged_server_tools | responses_protocol._logged_tool_types)
