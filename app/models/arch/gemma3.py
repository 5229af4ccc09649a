"""Gemma 3 (GGUF ``general.architecture`` "gemma3") on ExecuTorch's llama model.

What the GGUF says and where it goes (the 270M's values in brackets):

- ``attention.key_length`` / ``value_length`` [256]: ``head_dim``, not ``embedding_length / head_count``
  [640 / 4 = 160]. Attention scale 1/sqrt(head_dim), the custom SDPA op's default: Gemma's
  ``query_pre_attn_scalar`` is not in the GGUF; llama.cpp uses head_dim for every size but 27B
  (refused below).
- ``attn_q_norm`` / ``attn_k_norm``: per-head RMSNorm of q and k before rope (``use_qk_norm``,
  ``qk_norm_before_rope``).
- ``post_attention_norm`` / ``post_ffw_norm``: RMSNorms of the attention and FFN outputs before the
  residual adds; ``ffn_norm`` is the pre-FFN norm. ExecuTorch's ``TransformerBlock`` has no such
  norms, so ``transforming()`` replaces each block by a ``Gemma3Block`` holding the same attention
  and FFN modules (the exporter's later transforms find them where they always are).
- Norm weights: Gemma computes ``x * (1 + w)``; llama.cpp's converter stores ``1 + w`` in the GGUF,
  so ExecuTorch's plain RMSNorm is right as is.
- FFN: GELU with the tanh approximation (``gelu_approx``), gated like SwiGLU.
- Embeddings scaled by sqrt(embedding_length) [25.3]: folded into the embedding table of the
  checkpoint (``fold``); the output projection is tied, so it gets its own unscaled copy first.
- Rope: half-split (HF) layout, as llama.cpp's NEOX rope type keeps it (``use_hf_rope``). Global
  layers use ``rope.freq_base`` [1e6]; sliding-window layers 10,000 (``rope.freq_base_swa`` when
  the GGUF has it, else llama.cpp's constant for gemma3). The model's one rope table is replaced
  by global and local tables side by side; each block takes its half.
- Layer pattern: every 6th layer global, the others sliding-window with ``attention.sliding_window``
  [512] (llama.cpp's fixed gemma3 pattern; ``attention.sliding_window_pattern`` when present).
  ``llama::custom_sdpa`` has no window argument: in a build whose context exceeds the window, the
  sliding layers give it an additive window mask instead (``_WindowMask``; our kernels support the
  mask path), at the cost of attending over the whole cache, masked. Up to the window (a window of
  W positions: distance < W) every layer is global and no mask is made.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator

from ..gguf_meta import arch_value

LAYER_NAMES = {
    "attn_q_norm.weight": "attention.q_norm_fn.weight",
    "attn_k_norm.weight": "attention.k_norm_fn.weight",
    "post_attention_norm.weight": "post_attention_norm.weight",
    "post_ffw_norm.weight": "post_ffn_norm.weight",
}
SWA_PATTERN = 6  # llama.cpp: gemma3 layers 5, 11, 17, ... are global
LOCAL_ROPE_THETA = 10000.0  # llama.cpp's rope_freq_base_train_swa for gemma3
SLIDING, GLOBAL = "sliding_attention", "full_attention"


def check(md: dict[str, Any]) -> None:
    """Refuse gemma3 files this module does not map (one line each; ``md``: the header's scalars)."""
    from . import UnsupportedGGUF

    kl, vl = arch_value(md, "attention.key_length"), arch_value(md, "attention.value_length")
    if kl is None or kl != vl:
        raise UnsupportedGGUF(f"gemma3: key_length {kl} != value_length {vl}")
    scaling = arch_value(md, "rope.scaling.type")
    if scaling not in (None, "none") and float(arch_value(md, "rope.scaling.factor", 1.0)) != 1.0:
        raise UnsupportedGGUF(f"gemma3 with rope scaling {scaling!r} x{arch_value(md, 'rope.scaling.factor')} "
                              "(Gemma 3 4B and larger) is not supported yet")
    if int(arch_value(md, "block_count", 0)) == 62:
        raise UnsupportedGGUF("gemma3 27B (query scale from dim/heads) is not supported yet")


def layer_types(md: dict[str, Any]) -> list[str]:
    n = int(arch_value(md, "block_count"))
    pattern = arch_value(md, "attention.sliding_window_pattern")
    if isinstance(pattern, list):  # per-layer flags: true = sliding window
        return [SLIDING if p else GLOBAL for p in pattern]
    period = int(pattern) if pattern else SWA_PATTERN
    return [GLOBAL if (i + 1) % period == 0 else SLIDING for i in range(n)]


def update_params(md: dict[str, Any], params: dict[str, Any]) -> None:
    """Gemma 3's fields of ``params.json`` (ExecuTorch ``ModelArgs``), in place."""
    params.update({
        "head_dim": int(arch_value(md, "attention.key_length")),
        "use_hf_rope": True,
        "use_qk_norm": True,
        "qk_norm_before_rope": True,
        "act_fn": "gelu_approx",
        "post_attention_norm": True,
        "post_ffn_norm": True,
        "local_rope_theta": float(arch_value(md, "rope.freq_base_swa", LOCAL_ROPE_THETA)),
        "sliding_window": int(arch_value(md, "attention.sliding_window")),
        "layer_types": layer_types(md),
    })


class _WindowMask:
    """``attention.mask`` of a sliding-window layer in a build whose context exceeds the window.

    ``AttentionMHA.forward`` narrows its mask to the rows of the positions it computes; this
    object makes those rows instead of holding a context x context buffer: an additive float mask
    ``[rows, context]``, 0 where ``0 <= q - k < window`` (Gemma's sliding window: ``window``
    positions including the query's own), -inf elsewhere. With it the custom SDPA op takes the
    mask path (``use_attention_mask``: attends over the whole cache, masked), which our kernels
    (native/src/llm_kernels.cpp) support; the KV cache keeps every position.
    """

    def __init__(self, window: int, context: int):
        self.window, self.context = window, context

    def narrow(self, dim: int, start, length):
        import torch

        q = torch.arange(length, dtype=torch.int64) + start
        d = q.unsqueeze(1) - torch.arange(self.context, dtype=torch.int64).unsqueeze(0)
        allowed = (d >= 0) & (d < self.window)
        return torch.zeros(allowed.shape, dtype=torch.float32).masked_fill(allowed.logical_not(), float("-inf"))

    def __getitem__(self, index):
        if isinstance(index, tuple):  # no KV cache: mask[:seqlen, :seqlen]
            return self.narrow(0, 0, self.context)[index]
        return self.narrow(0, index[0], index.shape[0])  # static shapes: the rows of input_pos


def fold(sd: dict, params: dict[str, Any]) -> None:
    """Scale the embedding table by sqrt(dim) (the output projection keeps its own unscaled copy)."""
    import torch

    emb = sd["tok_embeddings.weight"]
    if sd.get("output.weight") is emb:
        sd["output.weight"] = emb.clone()
    sd["tok_embeddings.weight"] = emb * torch.tensor(math.sqrt(params["dim"]), dtype=emb.dtype)


def _block_class():
    import torch
    import torch.nn.functional as F
    from executorch.examples.models.llama.norm import RMSNorm

    class Gemma3Block(torch.nn.Module):
        """Gemma 3's decoder layer around ExecuTorch's attention and FFN modules:
        ``h = x + post_attn_norm(attn(attn_norm(x)))``, ``out = h + post_ffn_norm(ffn(ffn_norm(h)))``
        with a GELU-tanh gated FFN, and this layer's half of the side-by-side rope tables."""

        def __init__(self, block, args, local: bool, windowed: bool = False):
            super().__init__()
            self.windowed = windowed  # a local layer in a context longer than its window
            self.attention = block.attention
            self.attention_norm = block.attention_norm
            self.feed_forward = block.feed_forward
            self.ffn_norm = block.ffn_norm
            self.post_attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
            self.post_ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)
            self.local = local

        def use_window_mask(self) -> None:
            """The exporter swaps the SDPA modules after construction (custom op, ``use_attention_mask``
            False): make this layer's take the mask it is given."""
            sdpa = getattr(self.attention, "SDPA", None)
            if sdpa is None or type(sdpa).__name__ == "SDPA":  # ExecuTorch's own: uses the mask as given
                return
            if not hasattr(sdpa, "use_attention_mask"):
                raise ValueError(f"gemma3: {type(sdpa).__name__} cannot take a sliding-window mask")
            if not sdpa.use_attention_mask:
                sdpa.use_attention_mask = True

        def forward(self, x, freqs_cos, freqs_sin, attn_options):
            if self.windowed:
                self.use_window_mask()  # set before tracing by transforming(); here for other callers
            half = freqs_cos.shape[-1] // 2
            if self.local:
                cos, sin = freqs_cos[..., half:], freqs_sin[..., half:]
            else:
                cos, sin = freqs_cos[..., :half], freqs_sin[..., :half]
            a, update = self.attention(self.attention_norm(x), cos, sin, **attn_options)
            h = x + self.post_attention_norm(a)
            ff = self.feed_forward
            y = self.ffn_norm(h)
            y = ff.w2(F.gelu(ff.w1(y), approximate="tanh") * ff.w3(y))
            return h + self.post_ffn_norm(y), update

    return Gemma3Block


def apply(model, args) -> None:
    """Turn a ``construct_transformer`` model built from Gemma 3 params into Gemma 3, in place."""
    import torch
    from executorch.examples.models.llama.rope import hf_precompute_freqs_cis

    if not args.use_hf_rope or args.partial_rotary_factor != 1.0:
        raise ValueError("gemma3: expected full HF-layout rope")
    types = args.layer_types or []
    if len(types) != args.n_layers:
        raise ValueError(f"gemma3: {len(types)} layer types for {args.n_layers} layers")
    rope = model.rope
    local_cos, local_sin = hf_precompute_freqs_cis(args.head_dim, args.max_context_len, args.local_rope_theta,
                                                   device="cpu")
    rope.register_buffer("freqs_cos", torch.cat([rope.freqs_cos, local_cos], dim=-1), persistent=False)
    rope.register_buffer("freqs_sin", torch.cat([rope.freqs_sin, local_sin], dim=-1), persistent=False)
    Gemma3Block = _block_class()
    window = args.sliding_window
    for i, block in enumerate(model.layers):
        local = types[i] == SLIDING
        windowed = local and bool(window) and args.max_context_len > window
        if windowed:
            attention = block.attention
            attention._buffers.pop("mask", None)  # ExecuTorch's causal mask buffer, if it has one
            object.__setattr__(attention, "mask", _WindowMask(window, args.max_context_len))
        model.layers[i] = Gemma3Block(block, args, local=local, windowed=windowed)


@contextlib.contextmanager
def transforming() -> Iterator[None]:
    """While active, the exporter's llama model is built as Gemma 3 (``apply`` after
    ``construct_transformer``, before the checkpoint is loaded into it)."""
    from executorch.examples.models.llama import export_llama_lib as lib
    from executorch.examples.models.llama import model as llama_model

    original = llama_model.construct_transformer
    original_prepare = lib._prepare_for_llama_export

    def construct(model_args):
        model = original(model_args)
        apply(model, model_args)
        return model

    def prepare(*args, **kwargs):  # after the source transforms: windowed layers take their masks
        manager = original_prepare(*args, **kwargs)
        for module in manager.model.modules():
            if getattr(module, "windowed", False):
                module.use_window_mask()
        return manager

    llama_model.construct_transformer = construct
    lib._prepare_for_llama_export = prepare
    try:
        yield
    finally:
        llama_model.construct_transformer = original
        lib._prepare_for_llama_export = original_prepare
