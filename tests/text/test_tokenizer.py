"""Tokenizer vs transformers' GGUF tokenizer."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest

from app.text.tokenizer import Tokenizer


def test_encode_matches_transformers(tok, ref, sample):
    assert tok.encode(sample) == ref.encode(sample, add_special_tokens=False)


def test_decode_matches_transformers(tok, ref, sample):
    ids = tok.encode(sample)
    for skip in (False, True):
        assert tok.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)


def test_round_trip(tok, model, sample):
    ids = tok.encode(sample)
    text = unicodedata.normalize("NFC", sample) if model.nfc else sample
    assert tok.decode(ids) == text
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode("utf-8")


def test_qwen_normalizes_nfc(load_tok):
    tok = load_tok("qwen")
    assert tok.encode("e\u0301") == tok.encode("\u00e9")


def test_smollm2_digits_split_individually(load_tok):
    tok = load_tok("smollm2")
    for text in ("12345", " 2024", "x=1000000"):
        ids = tok.encode(text)
        digit_ids = [i for i in ids if tok.decode([i]).strip().isdigit()]
        assert all(len(tok.decode([i]).strip()) == 1 for i in digit_ids), (text, ids)
    assert tok.encode("12345") == [tok.token_to_id(d) for d in "12345"]


def test_smollm2_gguf_conversion_drops_digit_split(smollm2, load_tok):
    """Documents transformers' GGUF conversion: no Digits pre-tokenizer.

    SmolLM2's vocabulary has no multi-digit or space+digit tokens, so ASCII digits
    tokenize the same either way; only " " + a non-ASCII numeral shows the difference.
    """
    from transformers import AutoTokenizer

    raw = AutoTokenizer.from_pretrained(str(smollm2.ref_dir))
    assert "Digits" not in json.dumps(json.loads(raw.backend_tokenizer.to_str())["pre_tokenizer"])
    ours = load_tok("smollm2")
    for same in ("12345", " 2024", "x=1000000"):
        assert raw.encode(same, add_special_tokens=False) == ours.encode(same)
    space, arabic_3 = ours.token_to_id("Ġ"), ours.encode("٣")
    assert ours.encode(" ٣") == [space, *arabic_3]
    assert raw.encode(" ٣", add_special_tokens=False) != ours.encode(" ٣"), "conversion fixed: drop the Digits patch"


def test_special_tokens_in_text(tok):
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    start, end = tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")
    assert ids[0] == start and ids[-1] == end
    assert tok.is_special(start) and tok.is_special(end)
    assert tok.token_bytes(start) == b"<|im_start|>"
    assert not tok.is_special(tok.encode("hi")[0])
    assert tok.decode(ids, skip_special_tokens=True) == "user\nhi"


def test_metadata_smollm2(load_tok):
    tok = load_tok("smollm2")
    assert tok.vocab_size == 49152
    assert (tok.bos_token, tok.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert tok.token_to_id("<|im_start|>") == 1 and tok.id_to_token(2) == "<|im_end|>"
    assert tok.eos_token_ids == frozenset({2})
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    assert tok.model_max_length == 8192
    assert tok.encode("hi")[0] != 1  # no BOS added
    assert tok.encode("hi", add_bos=True)[0] == 1
    assert tok.encode("<|im_start|>hi", add_bos=True).count(1) == 1  # never doubled


def test_metadata_qwen(load_tok):
    tok = load_tok("qwen")
    assert tok.vocab_size == 151936
    assert tok.eos_token == "<|im_end|>" and tok.bos_token == "<|endoftext|>"
    assert tok.eos_token_ids == frozenset({151645, 151643})
    assert tok.encode("hi")[0] != 151643
    assert tok.model_max_length == 32768
    # <tool_call> is one token but not a special (control) token.
    assert tok.encode("<tool_call>") == [151657] and tok.encode("</tool_call>") == [151658]
    assert not tok.is_special(151657) and not tok.is_special(151658)
    assert tok.is_special(151643) and tok.is_special(151645)
    assert tok.decode([151657, 151645], skip_special_tokens=True) == "<tool_call>"


def test_token_bytes_partial_utf8(tok):
    """Byte-level tokens can hold part of a character; token_bytes keeps them raw."""
    ids = tok.encode("🌍")
    assert b"".join(tok.token_bytes(i) for i in ids) == "🌍".encode()
    assert tok.token_bytes(-1) == b"" and tok.token_bytes(tok.vocab_size) == b""


def test_config_variants(tmp_path: Path, smollm2):
    (tmp_path / "tokenizer.json").write_text((smollm2.model_dir / "tokenizer.json").read_text())
    config = {
        "bos_token": {"content": "<|im_start|>", "special": True},
        "eos_token": "<|im_end|>",
        "model_max_length": 1000000000000000019884624838656,
        "add_bos_token": True,
        "added_tokens_decoder": {"4": {"content": "<reponame>", "special": False}},
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.bos_token == "<|im_start|>" and tok.model_max_length is None and tok.chat_template is None
    assert tok.encode("hi")[0] == 1
    assert tok.eos_token_ids == frozenset({2})
    assert not tok.is_special(4) and tok.is_special(3)


def test_rejects_non_byte_level(tmp_path: Path):
    from tokenizers import Tokenizer as HF, decoders, models

    hf = HF(models.BPE(vocab={"a": 0}, merges=[]))
    hf.decoder = decoders.Metaspace()
    (tmp_path / "tokenizer.json").write_text(hf.to_str())
    with pytest.raises(ValueError, match="byte-level"):
        Tokenizer.from_dir(tmp_path)
