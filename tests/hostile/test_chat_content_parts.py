"""Chat completions' content parts (app/openai/chat/protocol.py): what the model cannot read
becomes a placeholder, as in the Responses and Messages APIs, so a thread holding a pasted image
goes on; an assistant's refusal part is text; text parts are joined a line apart."""

from __future__ import annotations

import logging

import pytest

from app.http.errors import APIError
from app.openai.chat.protocol import parse_chat_request

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
AUDIO = {"type": "input_audio", "input_audio": {"data": "UklGRiQ=", "format": "wav"}}
FILE = {"type": "file", "file": {"filename": "report.pdf", "file_data": "JVBERi0x"}}


def user(*parts):
    return parse_chat_request({"messages": [{"role": "user", "content": list(parts)}]}).messages[-1]["content"]


@pytest.mark.parametrize("part, shown", [(IMAGE, "[image: not shown"), (AUDIO, "[audio: not heard"),
                                         (FILE, "[file report.pdf: not shown")])
def test_parts_the_model_cannot_read_become_a_placeholder(part, shown, caplog):
    with caplog.at_level(logging.WARNING, logger="etserve"):
        text = user({"type": "text", "text": "What is this?"}, part)
    assert text.startswith("What is this?\n" + shown) and "this model reads text only" in text
    assert "iVBOR" not in text and "UklG" not in text and "JVBE" not in text


def test_text_parts_are_joined_a_line_apart():
    assert user({"type": "text", "text": "Say hi"}, {"type": "text", "text": "please"}) == "Say hi\nplease"


def test_an_assistant_refusal_part_is_its_text():
    req = parse_chat_request({"messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't help with that."}]},
        {"role": "user", "content": "ok"}]})
    assert req.messages[1]["content"] == "I can't help with that."


@pytest.mark.parametrize("part", [{"type": "hologram"}, {"type": "refusal", "refusal": "x"}, 5,
                                  {"type": "text", "text": 5}, {"type": ["image_url"]}, {"type": {"a": 1}},
                                  {"type": None}, {"text": "no type"}])
def test_other_parts_are_refused_by_name(part):
    with pytest.raises(APIError) as e:
        user(part)
    assert e.value.status == 400 and e.value.param.startswith("messages[0].content[0]")


@pytest.mark.parametrize("value", [["none"], {"a": 1}, 1, "bogus"])
def test_a_reasoning_format_that_is_not_one_of_its_names_is_a_400(value):
    with pytest.raises(APIError) as e:
        parse_chat_request({"messages": [{"role": "user", "content": "x"}], "reasoning_format": value})
    assert e.value.status == 400 and e.value.param == "reasoning_format"


def test_a_file_name_that_is_not_a_string_is_not_shown():
    assert user({"type": "file", "file": {"filename": {"a": 1}}}) == "[file: not shown, this model reads text only]"
