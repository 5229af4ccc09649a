"""The 8-bit output projection (app/models/export.py ``output_quantization``): with it, the
exporter's own 8da4w weight transform gives every linear but ``output`` 4-bit weights in groups
and ``output`` int8 weights with one scale per row; without it, ``output`` is 4-bit like the rest.
On a small random model of ExecuTorch's llama Transformer, through the exporter's
``get_quant_weight_transform`` (the function the real export calls)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("executorch")
pytest.importorskip("torchao")

from app.models.export import output_quantization  # noqa: E402

PARAMS = {"dim": 64, "n_layers": 1, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "vocab_size": 96,
          "hidden_dim": 128, "norm_eps": 1e-6, "rope_theta": 10000.0, "use_scaled_rope": False,
          "use_hf_rope": True, "attention_qkv_bias": True}


def _quantized(eight_bit: bool):
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs
    from executorch.examples.models.llama.source_transformation import quantize as qmod

    torch.manual_seed(0)
    model = construct_transformer(ModelArgs(**PARAMS, max_seq_len=16, max_context_len=16, use_kv_cache=False,
                                            generate_full_logits=True)).eval()
    fp32 = model.output.weight.detach().clone()
    with output_quantization(eight_bit):
        transform = qmod.get_quant_weight_transform("8da4w", group_size=32)
    with torch.no_grad():
        model = transform(model)
    return model, fp32


def _layout(weight) -> tuple[int, int, int]:
    """(lowest and highest quantized value, columns per scale) of a torchao intx weight."""
    q = weight.qdata
    return int(q.min()), int(q.max()), weight.block_size[-1]


def test_the_output_projection_is_8_bit_per_row_and_the_rest_4_bit():
    model, fp32 = _quantized(True)
    lo, hi, block = _layout(model.output.weight)
    assert block == PARAMS["dim"] and hi - lo > 15, (lo, hi, block)  # per row, more than 16 levels
    assert -128 <= lo and hi <= 127
    lo, hi, block = _layout(model.layers[0].attention.wq.weight)
    assert block == 32 and -8 <= lo and hi <= 7
    err = (model.output.weight.dequantize() - fp32).abs().max() / fp32.abs().max()
    assert err < 0.012, err  # half a step of 255 over the largest row
    assert model(torch.tensor([[1, 2, 3]])).shape[-1] == PARAMS["vocab_size"]


def test_without_it_the_output_projection_is_4_bit():
    model, fp32 = _quantized(False)
    lo, hi, block = _layout(model.output.weight)
    assert block == 32 and -8 <= lo and hi <= 7
    err = (model.output.weight.dequantize() - fp32).abs().max() / fp32.abs().max()
    assert err > 0.04, err  # half a step of 15


def test_it_composes_with_the_native_linears_and_both_unhook():
    """Both hooks wrap the exporter's quantize (app/models/quantize_hook.py), nested as the
    pipeline nests them: the 4-bit linears become etserve::linear_q4 modules, the 8-bit output
    projection stays a Linear (the operator takes 4-bit weights only), and on the way out the
    exporter has its own function back."""
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs
    from executorch.examples.models.llama.source_transformation import quantize as qmod

    from app.models.linear_q4 import swapping_linears

    before = qmod.quantize
    torch.manual_seed(0)
    model = construct_transformer(ModelArgs(**PARAMS, max_seq_len=16, max_context_len=16, use_kv_cache=False,
                                            generate_full_logits=True)).eval()
    with swapping_linears(True), output_quantization(True):
        assert qmod.quantize is not before
        transform = qmod.get_quant_weight_transform("8da4w", group_size=32)
        with torch.no_grad():
            model = transform(model)
    assert qmod.quantize is before
    assert type(model.layers[0].attention.wq).__name__ == "LinearQ4"
    assert type(model.layers[0].feed_forward.w2).__name__ == "LinearQ4"
    assert isinstance(model.output, torch.nn.Linear)
    lo, hi, block = _layout(model.output.weight)
    assert block == PARAMS["dim"] and hi - lo > 15
