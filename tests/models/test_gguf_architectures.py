"""qwen3 and Llama 3.x GGUFs (issue 36) built by `build-gguf` and checked against an independent
reference: transformers loading the same file, fp32 on both sides.

The files are tiny random GGUFs written here (tests/models/tiny_gguf.py: no model hub on the test
machines): a qwen3 whose head_dim (attention.key_length) is not dim / heads, with its q/k norms;
a Llama 3.2-style llama with llama.cpp's ``rope_freqs.weight`` (rope scaling factor 32) and
Llama 3's BPE tokenizer (pre "llama-bpe"). The builds run in a subprocess (the exporter's custom-op
library and libetserve.so must not share a process); the .pte runs through the native runtime.

What transformers does not read from a GGUF is given to it from what the file says: qwen3's
head_dim (its GGUF mapping has key_length for qwen3moe only) and Llama 3's rope scaling (it skips
``rope_freqs.weight``), so the reference computes both with its own code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gguf")

from models.tiny_gguf import llama3_rope_factors, write_tiny  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RTOL = 2e-5  # max |ours - transformers| over max |transformers| (fp32 both sides: ~4e-7 measured)
LLAMA32_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}
TOKENS = [(37 * i + 11) % 2000 + 5 for i in range(100)]  # positions up to 99: the scaled frequencies show


def build(gguf: Path, cache: Path, *options: str) -> Path:
    """``python -m app.models build-gguf FILE --quantize none`` (or ``options``) into ``cache``; the
    model directory."""
    proc = subprocess.run([sys.executable, "-m", "app.models", "build-gguf", str(gguf),
                           *(options or ("--quantize", "none")), "--max-seq-len", "128"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "ETSERVE_CACHE": str(cache), "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return Path(proc.stdout.strip().splitlines()[-1])


def reference_logits(gguf: Path, tokens: list[int], **config) -> np.ndarray:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, **config).eval()
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0, -1].numpy()


def our_logits(model_dir: Path, tokens: list[int]) -> np.ndarray:
    from app.engine import NativeModel

    m = NativeModel(model_dir / "model.pte")
    try:
        m.forward(tokens, 0)
        return np.frombuffer(m.logits(), dtype=np.float32).copy()
    finally:
        m.close()


def rel_diff(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


@pytest.mark.slow
def test_qwen3_logits_match_transformers(tmp_path):
    gguf = write_tiny(tmp_path / "tiny-qwen3.gguf", "qwen3", dim=64, heads=4, kv_heads=2, head_dim=32,
                      qk_norm=True, name="Tiny Qwen3")
    model_dir = build(gguf, tmp_path / "cache")
    params = json.loads((model_dir / "params.json").read_text())
    assert (params["head_dim"], params["use_qk_norm"], params["qk_norm_before_rope"]) == (32, True, True)
    assert params["use_hf_rope"] and not params["attention_qkv_bias"]
    ours = our_logits(model_dir, TOKENS)
    ref = reference_logits(gguf, TOKENS, head_dim=32)
    diff = rel_diff(ours, ref)
    print(f"qwen3: max abs logit diff / max |logit| vs transformers: {diff:.1e}")
    assert diff < RTOL


@pytest.mark.slow
def test_llama32_rope_scaling_logits_match_transformers(tmp_path):
    gguf = write_tiny(tmp_path / "tiny-llama3.gguf", "llama", tokenizer="llama3", dim=128, heads=4, kv_heads=2,
                      theta=500000.0, rope_freqs=llama3_rope_factors(32, 500000.0, 32.0), name="Tiny Llama 3.2")
    model_dir = build(gguf, tmp_path / "cache")
    params = json.loads((model_dir / "params.json").read_text())
    assert (params["use_scaled_rope"], params["rope_scale_factor"], params["high_freq_factor"]) == (True, 32, 4)
    assert not params["use_hf_rope"]
    ours = our_logits(model_dir, TOKENS)
    ref = reference_logits(gguf, TOKENS, rope_parameters={"rope_theta": 500000.0, **LLAMA32_ROPE})
    diff = rel_diff(ours, ref)
    print(f"llama 3.2 rope scaling: max abs logit diff / max |logit| vs transformers: {diff:.1e}")
    assert diff < RTOL
    unscaled = rel_diff(ours, reference_logits(gguf, TOKENS))  # the test sees the scaling
    assert unscaled > 50 * RTOL, unscaled


@pytest.mark.slow
def test_qwen2_with_8_bit_linears_stays_close_to_transformers(tmp_path):
    """`--quantize 8da8w`: every linear int8 with one scale per row (XNNPACK's qd8-f32-qc8w), the
    output projection included. Its logits sit between the fp32 build's (~3e-7 from transformers)
    and the 4-bit linears' (8.2e-2 measured on this file; 8da8w 1.6e-2): a build that fell back to
    either fails."""
    gguf = write_tiny(tmp_path / "tiny-qwen2.gguf", "qwen2", dim=128, heads=4, kv_heads=2, hidden=256,
                      qkv_bias=True, name="Tiny Qwen2")
    model_dir = build(gguf, tmp_path / "cache", "--quantize", "8da8w", "--kv-cache", "fp32")
    manifest = json.loads((model_dir / "etserve.json").read_text())
    assert manifest["quantize"] == "8da8w" and model_dir.name.startswith("ctx128-8da8w-"), model_dir.name
    diff = rel_diff(our_logits(model_dir, TOKENS), reference_logits(gguf, TOKENS))
    print(f"qwen2 8da8w: max abs logit diff / max |logit| vs transformers: {diff:.1e}")
    assert 1e-4 < diff < 0.04, diff


@pytest.mark.slow
def test_phi3_fused_partial_rotary_longrope_logits_match_transformers(tmp_path):
    """Phi-4-mini's shape of phi3: fused qkv and gate/up, 3/4 of each head rotary, LongRoPE with an
    original context (64) the build's (128) exceeds: the long factors and the attention factor."""
    rng = np.random.default_rng(1)
    short, long = 1 + rng.random(12) * 0.5, 1 + rng.random(12) * 8  # 24 rotary dims of 32
    gguf = write_tiny(tmp_path / "tiny-phi3.gguf", "phi3", dim=128, heads=4, kv_heads=4, theta=10000.0, rope_dims=24,
                      rope_factors=(short, long), original_context=64, tied=False, name="Tiny Phi3")
    model_dir = build(gguf, tmp_path / "cache")
    params = json.loads((model_dir / "params.json").read_text())
    assert (params["head_dim"], params["partial_rotary_factor"], params["original_max_position_embeddings"],
            params["max_position_embeddings"]) == (32, 0.75, 64, 512)
    assert params["use_hf_rope"] and len(params["rope_scaling_long_factor"]) == 12
    ours = our_logits(model_dir, TOKENS)
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
            "short_factor": [float(np.float32(x)) for x in short], "long_factor": [float(np.float32(x)) for x in long],
            "original_max_position_embeddings": 64}
    ref = reference_logits(gguf, TOKENS, rope_parameters=rope, original_max_position_embeddings=64)
    diff = rel_diff(ours, ref)
    print(f"phi3 (fused, partial rotary, LongRoPE): max abs logit diff / max |logit| vs transformers: {diff:.1e}")
    assert diff < RTOL


def test_phi3_checkpoint_splits_the_fused_tensors(tmp_path):
    """Without a build: attn_qkv's rows become wq/wk/wv (q: dim rows, k and v half the rest), ffn_up's
    halves w1 (gate) and w3 (up); no LongRoPE fields without the factor tensors (Phi-3-mini-4k)."""
    pytest.importorskip("torch")
    from app.models.checkpoint import dequantized_state_dict, make_params, rope_tensors
    from app.models.gguf_file import file_spec
    from app.models.gguf_meta import open_gguf, read_metadata

    path = write_tiny(tmp_path / "phi3.gguf", "phi3", layers=1, dim=64, heads=4, kv_heads=2, hidden=96,
                      rope_dims=16, original_context=4096)
    reader = open_gguf(path)
    spec = file_spec(path, reader)
    sd = dequantized_state_dict(reader, spec)
    fused = {t.name: np.asarray(t.data, dtype=np.float32) for t in reader.tensors}
    qkv, up = fused["blk.0.attn_qkv.weight"], fused["blk.0.ffn_up.weight"]
    assert qkv.shape == (64 + 2 * 32, 64) and up.shape == (2 * 96, 64)
    for name, rows in (("attention.wq", qkv[:64]), ("attention.wk", qkv[64:96]), ("attention.wv", qkv[96:]),
                       ("feed_forward.w1", up[:96]), ("feed_forward.w3", up[96:])):
        np.testing.assert_array_equal(sd[f"layers.0.{name}.weight"].numpy(), rows, err_msg=name)
    assert not any("qkv" in k or "w13" in k for k in sd)
    params = make_params(read_metadata(reader), spec, has_qkv_bias=False, rope=rope_tensors(reader))
    assert (params["head_dim"], params["partial_rotary_factor"], params["use_hf_rope"]) == (16, 1.0, True)
    assert not any(k.startswith("rope_scaling") or "position_embeddings" in k for k in params)
