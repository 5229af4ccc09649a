"""Tiny random GGUFs of the architectures we build, written with the ``gguf`` package's writer
(no model hub here): a few layers of small dims over a shrunk Qwen 2.5 vocabulary (the first
``VOCAB`` byte-level BPE pieces of the installed Qwen2.5-Coder GGUF, the merges among them, and
the special tokens of the chat format the test asks for). F32 tensors, so an fp32 build is exact
up to float rounding. Shapes are PyTorch's (out, in); the writer reverses them as GGUF does.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Optional

import numpy as np

VOCAB = 2048  # byte-level pieces kept from Qwen's vocabulary (the first 256 are the bytes)

QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
LLAMA3_SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                   "<|eot_id|>")
# Llama 3 / GPT-4o style only: Qwen has no multi-digit pieces (Llama 3 splits digits in runs of up to
# three), and "aB" is one piece where Llama 3's split keeps a word whole and GPT-4o's cuts at the case change.
DIGIT_MERGES = (("1", "2"), ("12", "3"), ("4", "5"), ("45", "6"), ("7", "8"), ("78", "9"), ("2", "3"), ("23", "4"),
                ("a", "B"))
QWEN_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA3_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
                   "{{ m['content'] }}<|eot_id|>{% endfor %}"
                   "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")


@lru_cache(maxsize=1)
def _qwen_pieces() -> tuple[list[str], list[str]]:
    """The first ``VOCAB`` pieces of Qwen's vocabulary and the merges that stay inside them."""
    from app.models.gguf_meta import open_gguf
    from app.models.gguf_source import locate_gguf
    from app.models.registry import get_spec

    reader = open_gguf(locate_gguf(get_spec("qwen2.5-coder-0.5b")))
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()[:VOCAB]
    kept = set(tokens)
    merges = []
    for m in reader.fields["tokenizer.ggml.merges"].contents():
        a, b = m.split(" ", 1)
        if a in kept and b in kept and a + b in kept:
            merges.append(m)
    return list(tokens), merges


def add_tokenizer(w, style: str, pre: Optional[str] = None) -> int:
    """Tokenizer metadata of ``style`` "qwen" (pre qwen2, ChatML) or "llama3" (pre llama-bpe, BOS
    added, Llama 3's header tokens; ``pre`` another pre-tokenizer); returns the vocabulary size."""
    import gguf

    tokens, merges = _qwen_pieces()
    if style == "llama3":
        tokens = tokens + [a + b for a, b in DIGIT_MERGES]
        merges = merges + [f"{a} {b}" for a, b in DIGIT_MERGES]
    specials = QWEN_SPECIALS if style == "qwen" else LLAMA3_SPECIALS
    tokens = tokens + list(specials)
    types = [gguf.TokenType.NORMAL] * (len(tokens) - len(specials)) + [gguf.TokenType.CONTROL] * len(specials)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    ids = {t: i for i, t in enumerate(tokens)}
    if style == "qwen":
        w.add_tokenizer_pre("qwen2")
        w.add_bos_token_id(ids["<|endoftext|>"])
        w.add_eos_token_id(ids["<|im_end|>"])
        w.add_pad_token_id(ids["<|endoftext|>"])
        w.add_add_bos_token(False)
        w.add_chat_template(QWEN_TEMPLATE)
    else:
        w.add_tokenizer_pre(pre or "llama-bpe")
        w.add_bos_token_id(ids["<|begin_of_text|>"])
        w.add_eos_token_id(ids["<|eot_id|>"])
        w.add_add_bos_token(True)
        w.add_chat_template(LLAMA3_TEMPLATE)
    return len(tokens)


def llama3_rope_factors(head_dim: int, theta: float, factor: float, low_freq_factor: float = 1.0,
                        high_freq_factor: float = 4.0, original_context: int = 8192) -> np.ndarray:
    """``rope_freqs.weight`` as llama.cpp's convert_hf_to_gguf.py writes it for a Llama 3.1/3.2
    checkpoint (rope_type "llama3"): the divisor of each rotary frequency."""
    import math

    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    low_wavelen, high_wavelen = original_context / low_freq_factor, original_context / high_freq_factor
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_tiny(path: Path, arch: str, *, tokenizer: str = "qwen", layers: int = 2, dim: int = 64,
               heads: int = 4, kv_heads: int = 2, head_dim: Optional[int] = None, hidden: int = 128,
               theta: float = 1e6, context: int = 512, qkv_bias: bool = False, qk_norm: bool = False,
               rope_freqs: Optional[np.ndarray] = None, tied: bool = True, name: str = "Tiny",
               rope_dims: Optional[int] = None, rope_factors: Optional[tuple] = None,
               original_context: Optional[int] = None, pre: Optional[str] = None, seed: int = 0,
               weight_type: str = "F32") -> Path:
    """A random ``arch`` GGUF at ``path``; ``head_dim`` given: written as ``attention.key_length``.

    phi3 as llama.cpp's converter writes it: q, k and v in one ``attn_qkv``, gate and up in one
    ``ffn_up`` (gate first), ``rope.dimension_count`` (``rope_dims``: partial rotary), LongRoPE's
    ``rope_factors`` (short, long) as ``rope_factors_short`` / ``_long`` tensors with
    ``rope.scaling.original_context_length``. ``weight_type`` "Q4_0": the matrices (embedding,
    projections) quantized to Q4_0 by the ``gguf`` package, as llama.cpp's Q4_0 files hold them."""
    import gguf

    rng = np.random.default_rng(seed)
    qtype = gguf.GGMLQuantizationType[weight_type]

    def rnd(*shape, scale=0.1):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(n):
        return (1.0 + rnd(n, scale=0.2)).astype(np.float32)

    hd = head_dim or dim // heads
    w = gguf.GGUFWriter(str(path), arch)
    add_vector = w.add_tensor

    def add_matrix(name, array):
        if qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, array)
        else:
            w.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
    w.add_name(name)
    w.add_block_count(layers)
    w.add_context_length(context)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(hidden)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(1e-6)
    if head_dim is not None:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if arch == "llama":
        w.add_rope_dimension_count(hd)
    if rope_dims is not None:
        w.add_rope_dimension_count(rope_dims)
    if original_context is not None:
        w.add_rope_scaling_orig_ctx_len(original_context)
    vocab = add_tokenizer(w, tokenizer, pre)
    add_matrix("token_embd.weight", rnd(vocab, dim, scale=1.0))
    if not tied:
        add_matrix("output.weight", rnd(vocab, dim))
    add_vector("output_norm.weight", norm(dim))
    if rope_freqs is not None:
        add_vector("rope_freqs.weight", np.asarray(rope_freqs, dtype=np.float32))
    if rope_factors is not None:
        add_vector("rope_factors_short.weight", np.asarray(rope_factors[0], dtype=np.float32))
        add_vector("rope_factors_long.weight", np.asarray(rope_factors[1], dtype=np.float32))
    fused = arch == "phi3"
    for i in range(layers):
        b = f"blk.{i}."
        add_vector(b + "attn_norm.weight", norm(dim))
        q, k, v = rnd(heads * hd, dim), rnd(kv_heads * hd, dim), rnd(kv_heads * hd, dim)
        if fused:
            add_matrix(b + "attn_qkv.weight", np.concatenate([q, k, v]))
        else:
            add_matrix(b + "attn_q.weight", q)
            add_matrix(b + "attn_k.weight", k)
            add_matrix(b + "attn_v.weight", v)
        if qkv_bias:
            add_vector(b + "attn_q.bias", rnd(heads * hd))
            add_vector(b + "attn_k.bias", rnd(kv_heads * hd))
            add_vector(b + "attn_v.bias", rnd(kv_heads * hd))
        if qk_norm:
            add_vector(b + "attn_q_norm.weight", norm(hd))
            add_vector(b + "attn_k_norm.weight", norm(hd))
        add_matrix(b + "attn_output.weight", rnd(dim, heads * hd))
        add_vector(b + "ffn_norm.weight", norm(dim))
        gate, up = rnd(hidden, dim), rnd(hidden, dim)
        if fused:
            add_matrix(b + "ffn_up.weight", np.concatenate([gate, up]))
        else:
            add_matrix(b + "ffn_gate.weight", gate)
            add_matrix(b + "ffn_up.weight", up)
        add_matrix(b + "ffn_down.weight", rnd(dim, hidden))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
