"""Key smoothing for int8 KV caches (app/models/kv_smoothing.py), on a small random model of
Qwen2's shape (q/k/v biases, grouped kv heads, half-split RoPE) built by ExecuTorch's own
Transformer, with key outliers planted in the k projection's bias as Qwen2 has them:

- folding the factors into the weights leaves the fp32 model's logits unchanged;
- both channels of each RoPE pair share a factor (for either RoPE layout);
- the keys the cache stores lose their outliers, and per-row int8 quantization of those keys
  (ExecuTorch's quantize_kv_cache scheme) perturbs the attention scores less than half as much.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("executorch")

from app.models import kv_smoothing  # noqa: E402

PARAMS = {"dim": 128, "n_layers": 2, "n_heads": 8, "n_kv_heads": 2, "head_dim": 32, "vocab_size": 128,
          "hidden_dim": 256, "norm_eps": 1e-6, "rope_theta": 10000.0, "use_scaled_rope": False,
          "use_hf_rope": True, "attention_qkv_bias": True}
OUTLIERS = (3, 7, 20)  # key channels of every kv head with a large bias


def _model(n: int):
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    return construct_transformer(ModelArgs(**PARAMS, max_seq_len=n, max_context_len=n, use_kv_cache=False,
                                           generate_full_logits=True)).eval()


@pytest.fixture(scope="module")
def state():
    torch.manual_seed(0)
    sd = _model(8).state_dict()
    hd = PARAMS["head_dim"]
    for i in range(PARAMS["n_layers"]):
        bias = sd[f"layers.{i}.attention.wk.bias"].view(PARAMS["n_kv_heads"], hd)
        for c in OUTLIERS:
            bias[:, c] = 40.0 * (1 if c % 2 else -1)
    return {k: v.clone() for k, v in sd.items()}


def _logits(sd, tokens):
    model = _model(len(tokens))
    model.load_state_dict(sd, strict=False)
    with torch.no_grad():
        return model(torch.tensor([tokens]))


def _int8_rows(x):
    """Per-row asymmetric int8 quantize-dequantize over the last dim (quantize_per_token)."""
    lo, hi = x.amin(-1, keepdim=True).clamp(max=0), x.amax(-1, keepdim=True).clamp(min=0)
    scale = ((hi - lo) / 255).clamp(min=1e-8)
    zp = torch.clamp(torch.round(-128 - lo / scale), -128, 127)
    return (torch.clamp(torch.round(x / scale) + zp, -128, 127) - zp) * scale


def _qk(sd, layer, tokens):
    """Queries and keys (before RoPE) of `layer` for `tokens`, [heads, n, head_dim]."""
    model = _model(len(tokens))
    model.load_state_dict(sd, strict=False)
    got = {}
    att = model.layers[layer].attention
    hooks = [att.wq.register_forward_hook(lambda m, i, o: got.__setitem__("q", o)),
             att.wk.register_forward_hook(lambda m, i, o: got.__setitem__("k", o))]
    with torch.no_grad():
        model(torch.tensor([tokens]))
    for h in hooks:
        h.remove()
    hd = PARAMS["head_dim"]
    return (got["q"][0].view(len(tokens), -1, hd).transpose(0, 1),
            got["k"][0].view(len(tokens), -1, hd).transpose(0, 1))


def test_pairs():
    assert kv_smoothing.pair_index(8, True).tolist() == [4, 5, 6, 7, 0, 1, 2, 3]
    assert kv_smoothing.pair_index(8, False).tolist() == [1, 0, 3, 2, 5, 4, 7, 6]


def test_smoothing_is_exact_and_tames_the_key_outliers(state):
    calib = [(5 * i + 1) % PARAMS["vocab_size"] for i in range(200)]
    tokens = [(7 * i + 3) % PARAMS["vocab_size"] for i in range(64)]
    kmax, qmax = kv_smoothing.calibration_maxima(state, PARAMS, calib)
    n_rep = PARAMS["n_heads"] // PARAMS["n_kv_heads"]
    s = kv_smoothing.factors(kmax, qmax, n_rep)
    hd = PARAMS["head_dim"]
    assert s.shape == (PARAMS["n_layers"], PARAMS["n_kv_heads"], hd)
    assert torch.equal(s, s[..., kv_smoothing.pair_index(hd, True)])  # RoPE pairs share a factor
    assert torch.allclose(s.mean(-1), torch.ones(s.shape[:2]))

    smoothed = {k: v.clone() for k, v in state.items()}
    kv_smoothing.apply_factors(smoothed, s, PARAMS)
    before, after = _logits(state, tokens), _logits(smoothed, tokens)
    assert torch.allclose(before, after, atol=1e-4, rtol=1e-4), (before - after).abs().max()
    assert not torch.equal(smoothed["layers.0.attention.wk.weight"], state["layers.0.attention.wk.weight"])

    # what int8 keys do to the scores q . k, without and with the factors
    for layer in range(PARAMS["n_layers"]):
        q0, k0 = _qk(state, layer, tokens)
        q1, k1 = _qk(smoothed, layer, tokens)
        k0 = k0.repeat_interleave(n_rep, 0)
        k1 = k1.repeat_interleave(n_rep, 0)
        exact = q0 @ k0.transpose(1, 2)
        assert torch.allclose(q1 @ k1.transpose(1, 2), exact, atol=1e-3, rtol=1e-4)
        err0 = (q0 @ _int8_rows(k0).transpose(1, 2) - exact).abs().mean()
        err1 = (q1 @ _int8_rows(k1).transpose(1, 2) - exact).abs().mean()
        ratio = lambda k: (k.abs().amax(1).amax(-1) / k.abs().amax(1).median(-1).values).max()  # noqa: E731
        print(f"layer {layer}: key outlier ratio {ratio(k0):.1f} -> {ratio(k1):.1f}; "
              f"mean |score error| of int8 keys {err0:.4f} -> {err1:.4f}")
        assert ratio(k1) < ratio(k0) / 3
        assert err1 < err0 / 2


def test_replay_folds_the_saved_factors(state, tmp_path):
    """What the build saves (kv_smoothing.FILE) gives the eager reference the same weights."""
    import json

    tok = tmp_path / "tokenizer.json"
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    # one token per printable character
    t = Tokenizer(models.WordLevel({chr(32 + i): i for i in range(95)} | {"[UNK]": 95}, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    t.save(str(tok))
    built = {k: v.clone() for k, v in state.items()}
    saved = json.loads(json.dumps(kv_smoothing.smooth_keys(built, PARAMS, tok)))
    replayed = {k: v.clone() for k, v in state.items()}
    kv_smoothing.replay(replayed, PARAMS, saved)
    for name in built:
        assert torch.equal(built[name], replayed[name]), name
    assert saved["calibration_tokens"] == kv_smoothing.CALIBRATION_TOKENS
    assert saved["key_outlier_ratio_after"] < saved["key_outlier_ratio_before"] / 3


@pytest.mark.parametrize("extra", [{"use_qk_norm": True}, {"partial_rotary_factor": 0.75}])
def test_smoothing_refuses_qk_norms_and_partial_rope(extra):
    """qwen3 / gemma3's q/k norms and phi3's partial rope would make the fold inexact: refused."""
    from app.models.kv_smoothing import check_params

    check_params({"use_hf_rope": True})
    with pytest.raises(ValueError, match="not exact with q/k norms or a partial rope"):
        check_params({"use_hf_rope": True, **extra})
