"""Key smoothing for int8 KV caches (build time; needs torch + executorch).

ExecuTorch's int8 cache (``quantize_kv_cache``) stores each key row of a head with one scale
and zero point over its ``head_dim`` channels. Qwen2's keys have a few channels whose range is
10-30× the others' (the k projection's bias), so one scale per row spreads those outliers
over every channel: measured on Qwen2.5-Coder-0.5B over 4k tokens, int8 keys alone cost +4%
perplexity and next-token KL up to 3 against the fp32 cache.

The fix is exact algebra folded into the weights: for a per-channel factor ``s`` of each kv
head, ``q · k = (q ⊙ s) · (k ⊘ s)``, so the q projection's rows (and bias) are multiplied by
``s`` and the k projection's divided by it. The attention scores are unchanged in exact
arithmetic; the keys the cache stores have the outliers divided away. RoPE rotates channel
``i`` with channel ``i + head_dim/2`` (``use_hf_rope``) or ``2i`` with ``2i+1``, so both
channels of a rotated pair get the same factor, and the factor commutes with the rotation.
Groupwise weight quantization is equivariant to scaling an output row, so the 4-bit weights
carry the factors exactly too.

``s`` comes from a calibration pass of the fp32 model over a fixed text
(``data/kv_calibration.txt``): per channel pair, the largest norm the keys reach (``kmax``)
and the largest the queries reach (``qmax``); ``s = kmax^a / qmax^(1-a)``, ``a = 0.75``,
normalized to a mean of 1 per head. Measured (eager Qwen2.5-Coder-0.5B, 4,096 tokens of
bench/data/coriolanus.txt, calibration on other text): int8 q, k and v as ExecuTorch quantizes
them, against the fp32 cache:

    keys as they are:  perplexity +4.0%, KL mean 0.036, max 1.70
    smoothed keys:     perplexity +0.2%, KL mean 0.0098, max 0.19

(int8 queries alone, or int8 values alone, give KL mean ~0.009: the rest is at that floor.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CALIBRATION_TEXT = Path(__file__).with_name("data") / "kv_calibration.txt"
FILE = "kv_smoothing.json"  # in a model directory built with smoothed keys: the factors, for the eager reference
ALPHA = 0.75
CALIBRATION_TOKENS = 2048
FLOOR = 1e-3  # no channel pair's maximum below this (dead channels)


def pair_index(head_dim: int, hf_rope: bool):
    """For each channel, the index of the channel RoPE rotates it with."""
    import torch

    idx = torch.arange(head_dim)
    if hf_rope:
        return (idx + head_dim // 2) % head_dim
    return idx ^ 1


def pair_max(x, hf_rope: bool):
    """x [..., head_dim] -> per channel, the norm of its rotated pair, maxed over the leading dims
    but the last two ([..., heads, head_dim] -> [heads, head_dim])."""
    import torch

    partner = pair_index(x.shape[-1], hf_rope)
    norm = torch.sqrt(x * x + x[..., partner] * x[..., partner])
    return norm.reshape(-1, *x.shape[-2:]).amax(0)


def factors(kmax, qmax, n_rep: int, alpha: float = ALPHA):
    """Smoothing factors [layers, kv heads, head_dim] from the maxima of the keys [layers, kv heads,
    head_dim] and the queries [layers, heads, head_dim] (their heads grouped by kv head)."""
    layers, hkv, d = kmax.shape
    qg = qmax.reshape(layers, hkv, n_rep, d).amax(2)
    s = kmax.clamp(min=FLOOR) ** alpha / qg.clamp(min=FLOOR) ** (1 - alpha)
    return s / s.mean(-1, keepdim=True)


def calibration_maxima(sd: dict, params: dict[str, Any], tokens: list[int]):
    """(kmax, qmax): the pair norms the fp32 model's keys and queries reach over ``tokens``, per
    layer, head and channel (before RoPE, which leaves a pair's norm unchanged)."""
    import torch
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    n = len(tokens)
    args = ModelArgs(**params, max_seq_len=n, max_context_len=n, use_kv_cache=False, generate_full_logits=False)
    # weights assigned, not copied: the state dict's tensors (a checkpoint's file-backed map,
    # app/models/checkpoint.py) are the model's, so a 7B calibrates without a second fp32 copy
    with torch.device("meta"):
        model = construct_transformer(args)
    missing, unexpected = model.load_state_dict(sd, strict=False, assign=True)
    params_missing = [m for m in missing if m in dict(model.named_parameters())]
    if params_missing or unexpected:
        raise RuntimeError(f"calibration model: missing {params_missing[:5]}, unexpected {unexpected[:5]}")
    still_meta = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if still_meta:
        raise RuntimeError(f"calibration model: no values for {still_meta[:5]}")
    model.eval()
    hd, hf = params["head_dim"], params.get("use_hf_rope", False)
    stores: list[dict] = []  # per layer: "k" and "q" maxima
    hooks = []
    for layer in model.layers:
        att = layer.attention
        store: dict = {}
        stores.append(store)
        hooks.append(att.wk.register_forward_hook(
            lambda m, i, o, st=store: st.__setitem__("k", pair_max(o.reshape(*o.shape[:-1], -1, hd), hf))))
        hooks.append(att.wq.register_forward_hook(
            lambda m, i, o, st=store: st.__setitem__("q", pair_max(o.reshape(*o.shape[:-1], -1, hd), hf))))
    try:
        with torch.no_grad():
            model(torch.tensor([tokens], dtype=torch.long))
    finally:
        for h in hooks:
            h.remove()
    return torch.stack([st["k"] for st in stores]), torch.stack([st["q"] for st in stores])


def check_params(params: dict[str, Any]) -> None:
    """The folding is exact only where q and k go from the projections straight to a full rope: a
    q/k RMSNorm in between (qwen3, gemma3) normalizes the factors away and rescales the rest, and a
    partial rope (phi3's partial_rotary_factor) pairs other channels than the factors do."""
    if params.get("use_qk_norm") or float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError("int8 KV cache key smoothing is not exact with q/k norms or a partial rope "
                         "(qwen3, gemma3, phi3): build these with --kv-cache fp32")


def apply_factors(sd: dict, s, params: dict[str, Any]) -> None:
    """Fold the factors into the q and k projections of ``sd`` (in place): q rows ⊙ s, k rows ⊘ s."""
    check_params(params)
    n_rep = params["n_heads"] // params["n_kv_heads"]
    for i in range(s.shape[0]):
        sk = s[i].reshape(-1)  # kv heads * head_dim: the k projection's output rows
        sq = s[i].repeat_interleave(n_rep, 0).reshape(-1)  # the q projection's, head by head
        for name, f in (("wq", sq), ("wk", 1 / sk)):
            w = sd[f"layers.{i}.attention.{name}.weight"]
            sd[f"layers.{i}.attention.{name}.weight"] = w * f[:, None].to(w.dtype)
            bias = f"layers.{i}.attention.{name}.bias"
            if bias in sd:
                sd[bias] = sd[bias] * f.to(sd[bias].dtype)


def smooth_keys(sd: dict, params: dict[str, Any], tokenizer_json: Path) -> dict:
    """Compute the factors for ``sd`` from the calibration text and fold them in; returns what
    ``FILE`` holds: a summary and the factors (``replay`` folds the same ones in again)."""
    from tokenizers import Tokenizer

    check_params(params)  # before the calibration pass
    tokens = Tokenizer.from_file(str(tokenizer_json)).encode(CALIBRATION_TEXT.read_text()).ids[:CALIBRATION_TOKENS]
    kmax, qmax = calibration_maxima(sd, params, tokens)
    s = factors(kmax, qmax, params["n_heads"] // params["n_kv_heads"])
    apply_factors(sd, s, params)
    ratio = lambda m: (m.amax(-1) / m.median(-1).values).max().item()  # noqa: E731
    return {"alpha": ALPHA, "calibration_tokens": len(tokens),
            "key_outlier_ratio_before": round(ratio(kmax), 2),
            "key_outlier_ratio_after": round(ratio(kmax / s), 2),
            "factors": s.tolist()}


def replay(sd: dict, params: dict[str, Any], saved: dict) -> None:
    """Fold the factors a build saved (``FILE``) into ``sd``."""
    import torch

    apply_factors(sd, torch.tensor(saved["factors"], dtype=torch.float32), params)


def summary(saved: dict) -> dict:
    return {k: v for k, v in saved.items() if k != "factors"}
