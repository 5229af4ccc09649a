"""Llama 3.x GGUFs without a build (issue 36): the BPE tokenizer (pre "llama-bpe") against
transformers' GGUF tokenizer, and the rope scaling derived from ``rope_freqs.weight`` (Llama 3.1's
factor 8, 3.2's 32) checked against what ExecuTorch computes, refused by name when it differs."""

from __future__ import annotations

import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from models.tiny_gguf import llama3_rope_factors, write_tiny  # noqa: E402

from app.models.arch import UnsupportedGGUF, check_gguf  # noqa: E402

TEXTS = [
    "Hello world!",
    "The year 2024 has 365 days; 1234567890 and 3.14159e-10, 0x1F.",
    " 42  apples\t\tand 7 pears 123456789",
    "  leading and trailing spaces  ",
    "line one\nline two\r\n\n\nafter blanks",
    "héllo wörld — “quotes” naïve café",
    "日本語のテキスト 中文 한국어 русский emoji 🤖🎉👍🏽",
    "def add(a, b):\n    \"\"\"Add.\"\"\"\n    return a + b  # sum\n",
    "don't I'll WE'RE they've",
    "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>",
    "",
]


@pytest.fixture(scope="module")
def llama3_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama3") / "tiny-llama3.gguf"
    return write_tiny(path, "llama", tokenizer="llama3", layers=1, dim=64, heads=2, kv_heads=1, theta=500000.0,
                      rope_freqs=llama3_rope_factors(32, 500000.0, 8.0), name="Tiny Llama 3.1")


def test_gpt4o_pre_tokenizer_matches_transformers(tmp_path):
    """Phi-4-mini's BPE (pre "gpt-4o", o200k's split: cased words, digits in threes, "/" kept with
    newlines) on the same tiny vocabulary."""
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from app.models.gguf_file import file_spec
    from app.models.gguf_meta import open_gguf, read_metadata
    from app.models.tokenizer_files import write_tokenizer_files

    (tmp_path / "gguf").mkdir()  # transformers reads the GGUF's directory: not our tokenizer.json's
    path = write_tiny(tmp_path / "gguf" / "gpt4o.gguf", "phi3", tokenizer="llama3", pre="gpt-4o", layers=1, dim=64,
                      heads=2, kv_heads=2)
    write_tokenizer_files(read_metadata(open_gguf(path)), file_spec(path), tmp_path, max_seq_len=128)
    ours = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    reference = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in TEXTS + ["CamelCaseWords HTTPServer don'T a/b\n/c", "aB xaBy"]:
        assert ours.encode(text).ids == reference.encode(text, add_special_tokens=False), text
    assert len(ours.encode("aB").ids) == 2  # cut at the case change (Llama 3's split: one piece)


def test_llama3_tokenizer_matches_transformers(llama3_file, tmp_path):
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from app.models.gguf_file import file_spec
    from app.models.gguf_meta import open_gguf, read_metadata
    from app.models.tokenizer_files import write_tokenizer_files
    from app.text.tokenizer import Tokenizer as ServedTokenizer

    spec = file_spec(llama3_file)
    cfg = write_tokenizer_files(read_metadata(open_gguf(llama3_file)), spec, tmp_path, max_seq_len=128)
    ours = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    reference = AutoTokenizer.from_pretrained(str(llama3_file.parent), gguf_file=llama3_file.name)
    for text in TEXTS:
        assert ours.encode(text).ids == reference.encode(text, add_special_tokens=False), text
    assert len(ours.encode("123456789").ids) == 3  # digits in runs of three (pre "llama-bpe")
    assert len(ours.encode("aB").ids) == 1
    served = ServedTokenizer.from_dir(tmp_path)
    bos, eot = served.token_to_id("<|begin_of_text|>"), served.token_to_id("<|eot_id|>")
    assert cfg["add_bos_token"] is True and served.encode("Hi")[0] == bos
    assert eot in served.eos_token_ids and spec.bos_token_id == bos
    assert served.token_to_id("<|end_of_text|>") in served.eos_token_ids  # Llama 3 instruct stops there too
    assert not spec.use_hf_rope  # llama.cpp permutes llama's q/k to the interleaved layout


@pytest.mark.parametrize("factor", [8.0, 32.0])  # Llama 3.1, Llama 3.2
def test_llama3_rope_scaling_is_executorchs(factor):
    torch = pytest.importorskip("torch")
    pytest.importorskip("executorch")
    from app.models.arch.llama3_rope import scaling_params

    md = {"general.architecture": "llama"}
    rope_freqs = torch.from_numpy(llama3_rope_factors(128, 500000.0, factor))
    assert scaling_params(md, rope_freqs, 128, 500000.0) == {
        "use_scaled_rope": True, "rope_scale_factor": int(factor), "high_freq_factor": 4}
    assert scaling_params(md, torch.ones(64), 128, 500000.0) == {"use_scaled_rope": False}


@pytest.mark.parametrize("variant, named", [
    (dict(high_freq_factor=2.0), "dimension"),
    (dict(low_freq_factor=2.0), "dimension"),
    (dict(original_context=4096), "dimension"),
])
def test_other_rope_scaling_is_refused_by_name(variant, named):
    torch = pytest.importorskip("torch")
    pytest.importorskip("executorch")
    from app.models.arch.llama3_rope import scaling_params

    rope_freqs = torch.from_numpy(llama3_rope_factors(128, 500000.0, 8.0, **variant))
    with pytest.raises(UnsupportedGGUF) as info:
        scaling_params({"general.architecture": "llama"}, rope_freqs, 128, 500000.0)
    message = str(info.value)
    assert "\n" not in message and "rope_freqs.weight is not Llama 3 rope scaling with factor 8" in message
    assert named in message


def test_rope_freqs_outside_llama_and_linear_scaling_are_refused(tmp_path):
    qwen = write_tiny(tmp_path / "q.gguf", "qwen2", layers=1, rope_freqs=[1.0] * 8)
    with pytest.raises(UnsupportedGGUF, match="qwen2 with rope_freqs.weight"):
        check_gguf(qwen)
    path = tmp_path / "linear.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(4.0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedGGUF, match="llama with rope scaling 'linear' x4 is not supported"):
        check_gguf(path)
