"""tokenizer.json / tokenizer_config.json built from the GGUFs: round trips, transformers parity, template."""

from __future__ import annotations

import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from app.models.tokenizer_files import write_tokenizer_files  # noqa: E402

TEXTS = [
    "Hello world!",
    "The year 2024 has 365 days; 1234567890 and 3.14159e-10, 0x1F.",
    " 42  apples\t\tand 7 pears",
    "  leading and trailing spaces  ",
    "line one\nline two\r\n\n\nafter blanks",
    "héllo wörld — “quotes” naïve café",
    "日本語のテキスト 中文 한국어 Ελληνικά русский",
    "emoji 🤖🎉👍🏽 and symbols ∑∫√ ©®",
    "def add(a, b):\n    \"\"\"Add.\"\"\"\n    return a + b  # sum\n",
    "for (int i = 0; i < n; ++i) { x[i] = y[i] * 2; }",
    "don't I'll WE'RE they've",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "",
]


@pytest.fixture(scope="module", params=["smollm2-135m", "qwen2.5-coder-0.5b"])
def built(request, tmp_path_factory, gguf_metadata):
    spec, path, _, md = gguf_metadata(request.param)
    out = tmp_path_factory.mktemp(spec.name)
    cfg = write_tokenizer_files(md, spec, out, max_seq_len=512)
    from tokenizers import Tokenizer

    return spec, path, md, out, cfg, Tokenizer.from_file(str(out / "tokenizer.json"))


@pytest.fixture(scope="module")
def reference(built):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from transformers import AutoTokenizer

    _, path, *_ = built
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(built, text):
    *_, tok = built
    assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text


@pytest.mark.parametrize("text", TEXTS)
def test_matches_transformers_gguf_tokenizer(built, reference, text):
    *_, tok = built
    assert tok.encode(text).ids == reference.encode(text, add_special_tokens=False)


def test_nfc_normalization_qwen_only(built):
    spec, *_, tok = built
    decomposed = "cafe\u0301"  # e + combining acute
    ids = tok.encode(decomposed).ids
    if spec.name.startswith("qwen"):  # Qwen2's original tokenizer applies NFC; the GGUF loader does not
        assert ids == tok.encode("caf\u00e9").ids
    else:
        assert tok.decode(ids) == decomposed


def test_special_tokens(built):
    spec, _, md, _, cfg, tok = built
    for eos in cfg["eos_token_ids"]:
        content = md["tokenizer.ggml.tokens"][eos]
        assert tok.encode(content).ids == [eos]
    specials = {t.content: t.special for t in tok.get_added_tokens_decoder().values()}
    assert specials["<|im_start|>"] and specials["<|im_end|>"]
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>").ids
    assert ids[0] == tok.token_to_id("<|im_start|>") and ids[-1] == tok.token_to_id("<|im_end|>")
    assert tok.decode(ids, skip_special_tokens=True) == "user\nhi"


def test_qwen_tool_call_tokens_are_plain_added_tokens(built):
    spec, *_, tok = built
    if not spec.name.startswith("qwen"):
        pytest.skip("Qwen only")
    ids = tok.encode('<tool_call>\n{"name": "f"}\n</tool_call>').ids
    assert ids[0] == 151657 and ids[-1] == 151658
    text = tok.decode(ids, skip_special_tokens=True)
    assert text.startswith("<tool_call>") and text.endswith("</tool_call>")


def test_config(built):
    spec, _, md, _, cfg, _ = built
    assert cfg["add_bos_token"] is False
    assert cfg["model_max_length"] == 512
    assert cfg["eos_token"] == "<|im_end|>"
    assert cfg["eos_token_ids"][0] == md["tokenizer.ggml.eos_token_id"]
    assert set(cfg["eos_token_ids"]) == set(spec.eos_token_ids)
    assert cfg["chat_template"] == md["tokenizer.chat_template"]


def test_chat_template_renders(built):
    pytest.importorskip("transformers")
    from transformers import PreTrainedTokenizerFast

    spec, _, _, out, _, _ = built
    hf = PreTrainedTokenizerFast.from_pretrained(str(out))
    msgs = [{"role": "user", "content": "Hi"}]
    text = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert text.startswith("<|im_start|>system\n")
    if spec.name.startswith("qwen"):
        tools = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {}}}]
        with_tools = hf.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True)
        assert "<tools>" in with_tools and '"name": "f"' in with_tools


def test_vocab_size(built):
    _, _, md, _, _, tok = built
    assert tok.get_vocab_size() == len(md["tokenizer.ggml.tokens"])


def test_deepseek_r1_qwen_pre_tokenizer_is_qwen2s(gguf_metadata):
    """DeepSeek-R1's Qwen distills name their pre-tokenizer "deepseek-r1-qwen" (llama.cpp reads it
    as Qwen2's); the tokenizer built for it is Qwen2's."""
    from app.models.tokenizer_files import build_tokenizer

    spec, _path, _, md = gguf_metadata("qwen2.5-coder-0.5b")
    text = "Hello  world!\n  x = 12345 + 0.5  # Ünïcödé ﬁ\t<think>\n"
    qwen = build_tokenizer(md, spec).encode(text).ids
    assert build_tokenizer({**md, "tokenizer.ggml.pre": "deepseek-r1-qwen"}, spec).encode(text).ids == qwen


def test_non_ascii_control_tokens_keep_their_ids(gguf_metadata):
    """DeepSeek-R1's control tokens ("<｜User｜>", "<｜end▁of▁sentence｜>") are not in the byte
    alphabet: they must map to their own ids, not to new ones past the vocabulary (which the
    model has no embedding row for: the 7B's first request failed with "token id 152067 is
    outside the vocabulary")."""
    from app.models.tokenizer_files import build_tokenizer

    spec, _path, _, md = gguf_metadata("qwen2.5-coder-0.5b")
    tokens = list(md["tokenizer.ggml.tokens"])
    user, end = tokens.index("<|im_start|>"), tokens.index("<|im_end|>")
    tokens[user], tokens[end] = "<｜User｜>", "<｜end▁of▁sentence｜>"
    tok = build_tokenizer({**md, "tokenizer.ggml.tokens": tokens}, spec)
    assert tok.encode("<｜User｜>Hi<｜end▁of▁sentence｜>").ids == [user, *tok.encode("Hi").ids, end]
    assert tok.get_vocab_size() == len(tokens)
    assert tok.decode([user, end], skip_special_tokens=False) == "<｜User｜><｜end▁of▁sentence｜>"
