"""Gemma 3 270M's GGUF (SentencePiece BPE with byte fallback, no merges in the file): our
tokenizer.json against transformers' GGUF tokenizer, the server's token bytes, and the spec
`build-gguf` derives from the file against the registry's."""

from __future__ import annotations

import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from app.models.tokenizer_files import write_tokenizer_files  # noqa: E402

NAME = "gemma3-270m"
GEMMA_TEXTS = [
    "Hello world!",
    "The year 2024 has 365 days; 1234567890 and 3.14159e-10, 0x1F.",
    "  leading and trailing spaces  ",
    "line one\nline two\r\n\n\nafter blanks",
    "héllo wörld — “quotes” naïve café",
    "日本語のテキスト 中文 한국어 Ελληνικά русский",
    "emoji 🤖🎉👍🏽 and symbols ∑∫√ ©®",
    "def add(a, b):\n    \"\"\"Add.\"\"\"\n    return a + b  # sum\n",
    "don't I'll WE'RE they've",
    "",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "1, 2, 3, 4, 5,",
    "    indented\n\n\n\n\ttabs  and   runs of spaces     ",
    "<b>bold</b> &amp; <div class=\"x\">html</div>",
    "x" * 40 + " " + "ab" * 30,
]


@pytest.fixture(scope="module")
def built(tmp_path_factory, gguf_metadata):
    spec, path, _, md = gguf_metadata(NAME)
    out = tmp_path_factory.mktemp(NAME)
    cfg = write_tokenizer_files(md, spec, out, max_seq_len=512)
    return spec, path, md, out, cfg


@pytest.fixture(scope="module")
def reference(built):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from transformers import AutoTokenizer

    _, path, *_ = built
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def test_matches_transformers_gguf_tokenizer(built, reference):
    from tokenizers import Tokenizer

    *_, out, _ = built
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    for text in GEMMA_TEXTS:
        assert tok.encode(text).ids == reference.encode(text, add_special_tokens=False), text


def test_server_tokenizer_bytes_and_bos(built):
    from app.text.tokenizer import Tokenizer

    *_, out, cfg = built
    tok = Tokenizer.from_dir(out)
    assert cfg["add_bos_token"] is True and cfg["chat_template"] is None
    assert tok.bos_token_id == 2 and tok.eos_token_ids == {1, 106}
    for text in GEMMA_TEXTS:
        ids = tok.encode(text)
        assert ids[0] == 2
        specials = [i for i in ids[1:] if tok.is_special(i)]
        if not specials:  # streamed bytes are the text
            assert b"".join(tok.token_bytes(i) for i in ids[1:]).decode("utf-8") == text
    assert tok.token_bytes(tok.token_to_id("<0x0A>")) == b"\n"


def test_file_spec_matches_the_registry(built):
    from app.models.gguf_file import file_spec

    spec, path, *_ = built
    derived = file_spec(path)
    for field in ("architecture", "eos_token_ids", "bos_token_id", "pad_token_id", "use_hf_rope", "tied_output",
                  "split_digits", "default_quantize"):
        assert getattr(derived, field) == getattr(spec, field), field
    assert derived.name == "gemma-3-270m"
