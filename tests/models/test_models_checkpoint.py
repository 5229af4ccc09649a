"""params.json and tensor naming from the real GGUFs (no dequantization, no export)."""

from __future__ import annotations

import pytest

pytest.importorskip("gguf")

from app.models.checkpoint import executorch_name, make_params  # noqa: E402

EXPECTED = {
    "smollm2-135m": dict(dim=576, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64, vocab_size=49152,
                         hidden_dim=1536, rope_theta=1e5, use_hf_rope=False, attention_qkv_bias=False),
    "qwen2.5-coder-0.5b": dict(dim=896, n_layers=24, n_heads=14, n_kv_heads=2, head_dim=64, vocab_size=151936,
                               hidden_dim=4864, rope_theta=1e6, use_hf_rope=True, attention_qkv_bias=True),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_params_and_names(name, gguf_metadata):
    spec, _, reader, md = gguf_metadata(name)
    names = {executorch_name(t.name) for t in reader.tensors}
    params = make_params(md, spec, has_qkv_bias="layers.0.attention.wq.bias" in names)
    for key, value in EXPECTED[name].items():
        assert params[key] == pytest.approx(value), key
    assert ("output.weight" in names) == (not spec.tied_output)
    n = params["n_layers"]
    per_layer = 9 + (3 if params["attention_qkv_bias"] else 0)
    assert len(names) == 2 + (0 if spec.tied_output else 1) + n * per_layer
