"""``tokenizer.json`` and ``tokenizer_config.json`` from GGUF metadata (build time; needs ``tokenizers``)."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from app.text.tokenizer import byte_decoder

from .registry import ModelSpec

# llama.cpp token types.
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

# Llama 3's pre-tokenizer split (its tokenizer.json; GGUF pre "llama-bpe"): digits in runs of up to three.
LLAMA3_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# GPT-4o's (o200k) pre-tokenizer split (GGUF pre "gpt-4o": Phi-4-mini): cased words, digits in runs of three.
GPT4O_SPLIT = (
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
    r"""|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
    r"""|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Qwen2's pre-tokenizer split (transformers' models/qwen2 PRETOKENIZE_REGEX): digits one by one.
QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


@lru_cache(maxsize=1)
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table."""
    return {b: c for c, b in byte_decoder().items()}


def _byte_level_spelling(token: str) -> str:
    """A vocabulary entry in the byte alphabet (GGUF stores them so already, except oddities)."""
    table = _byte_alphabet()
    if set(token) <= set(table.values()):
        return token
    return "".join(table[b] for b in token.encode("utf-8"))


SPM_SPACE = "\u2581"  # SentencePiece's word boundary, "▁"


def spm_merges(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """BPE merges of a SentencePiece BPE vocabulary (GGUF ``tokenizer.ggml.model`` "llama" with no
    ``merges``): SentencePiece merges the adjacent pair whose joined piece has the highest score,
    so every split of a piece into two vocabulary pieces is a merge ranked by the piece's score.
    Control and byte-fallback pieces never come out of a merge."""
    ids = {t: i for i, t in enumerate(tokens) if types[i] in (TOKEN_NORMAL, TOKEN_USER_DEFINED)}
    ranked = []
    for piece, i in ids.items():
        for cut in range(1, len(piece)):
            a, b = piece[:cut], piece[cut:]
            ia, ib = ids.get(a), ids.get(b)
            if ia is not None and ib is not None:
                ranked.append((-scores[i], i, ia, ib, a, b))
    ranked.sort()
    return [(a, b) for *_, a, b in ranked]


def _build_spm_tokenizer(md: dict[str, Any]):
    """SentencePiece BPE with byte fallback (Gemma): spaces become "▁", no pre-tokenizer regex."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    tokens: list[str] = md["tokenizer.ggml.tokens"]
    types: list[int] = md["tokenizer.ggml.token_type"]
    scores: list[float] = md["tokenizer.ggml.scores"]
    unk = md.get("tokenizer.ggml.unknown_token_id")
    bpe = models.BPE(
        vocab={t: i for i, t in enumerate(tokens)}, merges=spm_merges(tokens, scores, types), dropout=None,
        unk_token=tokens[int(unk)] if unk is not None else None, fuse_unk=True, byte_fallback=True,
    )
    tok = Tokenizer(bpe)
    if md.get("tokenizer.ggml.add_space_prefix", False):
        tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPM_SPACE), normalizers.Replace(" ", SPM_SPACE)])
    else:
        tok.normalizer = normalizers.Replace(" ", SPM_SPACE)
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace(SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    return _with_added_tokens(tok, tokens, types)


def _with_added_tokens(tok, tokens: list[str], types: list[int]):
    """The vocabulary's control tokens as special tokens, its user-defined ones as added tokens."""
    from tokenizers import AddedToken

    added = [
        AddedToken(t, special=(ty == TOKEN_CONTROL), normalized=False)
        for t, ty in zip(tokens, types)
        if ty in (TOKEN_CONTROL, TOKEN_USER_DEFINED)
    ]
    tok.add_special_tokens([a for a in added if a.special])
    tok.add_tokens([a for a in added if not a.special])
    return tok


# GGUF pre-tokenizer names of Qwen2's split (llama.cpp's llama-vocab.cpp maps these to
# LLAMA_VOCAB_PRE_TYPE_QWEN2): DeepSeek-R1's Qwen distills keep Qwen2's tokenizer.
QWEN2_PRE = ("qwen2", "deepseek-r1-qwen")


def build_tokenizer(md: dict[str, Any], spec: ModelSpec):
    """A ``tokenizers.Tokenizer`` replicating the model's original Hugging Face tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    model = md.get("tokenizer.ggml.model")
    if model == "llama" and "tokenizer.ggml.merges" not in md:
        return _build_spm_tokenizer(md)
    if model != "gpt2":
        raise ValueError(f"unsupported GGUF tokenizer model {model!r} (supported: gpt2, llama)")
    tokens: list[str] = md["tokenizer.ggml.tokens"]
    types: list[int] = md["tokenizer.ggml.token_type"]
    # Control and user-defined tokens are added tokens, matched to the vocabulary by their text:
    # spelled in the byte alphabet (DeepSeek's "<｜User｜>" has non-ASCII characters) they would
    # miss it and get new ids past the vocabulary, which the model has no row for.
    vocab = {t if types and types[i] in (TOKEN_CONTROL, TOKEN_USER_DEFINED) else _byte_level_spelling(t): i
             for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in md["tokenizer.ggml.merges"]]
    bpe = models.BPE(
        vocab=vocab, merges=merges, dropout=None, unk_token=None,
        continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False, byte_fallback=False,
    )
    tok = Tokenizer(bpe)
    if spec.split_digits:  # SmolLM2 (GGUF pre "smollm"): digits split individually, then GPT-2 regex
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ])
    elif md.get("tokenizer.ggml.pre") in QWEN2_PRE:
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ])
    elif md.get("tokenizer.ggml.pre") in ("llama-bpe", "gpt-4o"):  # Llama 3.x; Phi-4-mini
        split = LLAMA3_SPLIT if md.get("tokenizer.ggml.pre") == "llama-bpe" else GPT4O_SPLIT
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ])
    else:
        raise ValueError(f"unsupported pre-tokenizer {md.get('tokenizer.ggml.pre')!r}")
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    return _with_added_tokens(tok, tokens, types)


def tokenizer_config(md: dict[str, Any], spec: ModelSpec, max_seq_len: int) -> dict[str, Any]:
    """``tokenizer_config.json`` content."""
    tokens = md["tokenizer.ggml.tokens"]
    eos_id = int(md["tokenizer.ggml.eos_token_id"])
    eos_ids = [eos_id] + [i for i in spec.eos_token_ids if i != eos_id]

    def tok(key: str):
        i = md.get(f"tokenizer.ggml.{key}")
        return tokens[int(i)] if i is not None else None

    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": md.get("tokenizer.chat_template"),
        "bos_token": tok("bos_token_id"),
        "eos_token": tok("eos_token_id"),
        "pad_token": tok("padding_token_id"),
        "unk_token": tok("unknown_token_id"),
        "add_bos_token": bool(md.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(max_seq_len),
        "eos_token_ids": eos_ids,
        "bos_token_id": int(md["tokenizer.ggml.bos_token_id"]),
    }


def write_tokenizer_files(md: dict[str, Any], spec: ModelSpec, out_dir: Path, max_seq_len: int) -> dict[str, Any]:
    """Write ``tokenizer.json`` and ``tokenizer_config.json``; returns the config."""
    build_tokenizer(md, spec).save(str(out_dir / "tokenizer.json"))
    cfg = tokenizer_config(md, spec, max_seq_len)
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    return cfg
