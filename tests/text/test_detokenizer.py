"""IncrementalDetokenizer: streamed text equals batch decode."""

from __future__ import annotations

import unicodedata

from hypothesis import given, settings
from hypothesis import strategies as st

from app.text.detokenizer import IncrementalDetokenizer
from app.text.tokenizer import byte_decoder

BYTE_CHAR = {b: c for c, b in byte_decoder().items()}


def stream(tok, ids, skip_special_tokens=True):
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip_special_tokens)
    deltas = [detok.push(i) for i in ids]
    deltas.append(detok.flush())
    assert detok.text == "".join(deltas)
    return deltas


def byte_ids(tok, text: str) -> list[int]:
    """One single-byte token per UTF-8 byte: splits every multi-byte character."""
    return [tok.token_to_id(BYTE_CHAR[b]) for b in text.encode("utf-8")]


def test_stream_equals_decode(tok, sample):
    ids = tok.encode(sample)
    for skip in (True, False):
        assert "".join(stream(tok, ids, skip)) == tok.decode(ids, skip_special_tokens=skip)


def test_split_mid_character(tok):
    text = "你好世界 🌍 café"
    ids = byte_ids(tok, text)
    deltas = stream(tok, ids)
    assert "".join(deltas) == text == tok.decode(ids)
    assert "\ufffd" not in "".join(deltas)
    # 你 is 3 bytes: nothing until the third.
    assert deltas[:3] == ["", "", "你"]
    # 🌍 is 4 bytes, starting at byte 13.
    assert deltas[13:17] == ["", "", "", "🌍"]


def test_real_tokens_split_characters(tok):
    """The real encoding of CJK/emoji has tokens that end mid-character; still exact."""
    text = "你好世界 🌍 café 👨‍👩‍👧‍👦 ありがとう"
    ids = tok.encode(text)
    assert any(_incomplete(tok.token_bytes(i)) for i in ids)
    assert "".join(stream(tok, ids)) == text


def _incomplete(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def test_invalid_bytes_replaced_at_once(tok):
    detok = IncrementalDetokenizer(tok)
    lone = tok.token_to_id(BYTE_CHAR[0x80])  # continuation byte without a lead
    assert detok.push(lone) == "\ufffd"
    e4 = tok.token_to_id(BYTE_CHAR[0xE4])  # lead byte of a 3-byte char
    assert detok.push(e4) == ""
    assert detok.push(tok.encode("A")[0]) == "\ufffdA"  # can never complete
    assert detok.push(e4) == ""
    assert detok.flush() == "\ufffd"
    assert detok.text == "\ufffd\ufffdA\ufffd"


def test_special_tokens(tok):
    eos = tok.token_to_id("<|im_end|>")
    ids = [*tok.encode("hi"), eos]
    assert "".join(stream(tok, ids)) == "hi"
    assert "".join(stream(tok, ids, skip_special_tokens=False)) == "hi<|im_end|>"


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_random_ids_equal_decode(tok, data):
    ids = data.draw(st.lists(st.integers(0, tok.vocab_size - 1), max_size=40))
    for skip in (True, False):
        assert "".join(stream(tok, ids, skip)) == tok.decode(ids, skip_special_tokens=skip)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 255), max_size=40))
def test_random_bytes_equal_decode(tok, raw):
    """Arbitrary byte soup (invalid UTF-8 included) matches the Rust lossy decode."""
    raw = [b for b in raw if tok.token_to_id(BYTE_CHAR[b]) is not None]  # SmolLM2 lacks some bytes
    ids = [tok.token_to_id(BYTE_CHAR[b]) for b in raw]
    assert "".join(stream(tok, ids)) == tok.decode(ids) == bytes(raw).decode("utf-8", "replace")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_random_text_round_trip(tok, model, text):
    text = unicodedata.normalize("NFC", text) if model.nfc else text
    ids = tok.encode(text)
    expected = text if _encodable(tok, text) else tok.decode(ids)  # SmolLM2 lacks some byte tokens
    assert "".join(stream(tok, ids, False)) == expected


def _encodable(tok, text: str) -> bool:
    return all(tok.token_to_id(BYTE_CHAR[b]) is not None for b in text.encode("utf-8"))
