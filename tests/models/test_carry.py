"""A GGUF's Q4_0 weights reach the 4-bit layout as the file holds them (app/models/carry.py).

The files are tiny random GGUFs whose matrices the ``gguf`` package quantized to Q4_0
(tests/models/tiny_gguf.py), streamed to a checkpoint as a build does; the quantization is
torchao's own ``IntxUnpackedToInt8Tensor.from_hp`` with HQQ scales, the call the exporter's 8da4w
transform and 4-bit embedding make, so what is checked is what the export gets.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
pytest.importorskip("torchao")

from models.tiny_gguf import write_tiny  # noqa: E402


def from_hp(weight, group: int = 32, dtype=None):
    """torchao's 4-bit (or ``dtype``) groupwise quantization with HQQ scales, as 8da4w makes it."""
    from torchao.quantization.quantize_.workflows.intx.intx_choose_qparams_algorithm import \
        IntxChooseQParamsAlgorithm
    from torchao.quantization.quantize_.workflows.intx.intx_unpacked_to_int8_tensor import \
        IntxUnpackedToInt8Tensor

    return IntxUnpackedToInt8Tensor.from_hp(weight, [1, group], dtype or torch.int4,
                                            intx_choose_qparams_algorithm=IntxChooseQParamsAlgorithm.HQQ_SCALE_ONLY)


@pytest.fixture(scope="module")
def q4_0_checkpoint(tmp_path_factory):
    """(reader, state dict, CarriedBlocks) of a tiny llama whose matrices are Q4_0."""
    from app.models.carry import CarriedBlocks
    from app.models.checkpoint import stream
    from app.models.gguf_file import file_spec
    from app.models.gguf_meta import open_gguf

    d = tmp_path_factory.mktemp("carry")
    path = write_tiny(d / "tiny-q4_0.gguf", "llama", layers=2, dim=64, heads=4, kv_heads=2, hidden=128,
                      weight_type="Q4_0", tied=False)
    reader = open_gguf(path)
    spec = file_spec(path, reader)
    carried = CarriedBlocks()
    streamed = stream(reader, spec, d / "checkpoint.pth", carried)
    streamed.finish()
    return reader, streamed.state_dict, carried


def test_blocks_decode_as_gguf_dequantizes():
    """``blocks`` reads values and scales that multiply back to gguf's own dequantization, bit for
    bit, with negative scales among them (Q4_0's d takes the sign of the largest weight)."""
    import gguf

    from app.models.carry import blocks

    rng = np.random.default_rng(1)
    w = rng.standard_normal((12, 96)).astype(np.float32)
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_0)

    class T:
        data = raw

    q, d = blocks(T, (2, 10))
    assert q.shape == (8, 96) and d.shape == (8, 3)
    assert q.min() >= -8 and q.max() <= 7 and (d < 0).any() and (d > 0).any()
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_0)[2:10]
    np.testing.assert_array_equal(q.astype(np.float32) * np.repeat(d, 32, axis=1), ref)


def test_every_q4_0_weight_is_recorded(q4_0_checkpoint):
    reader, sd, carried = q4_0_checkpoint
    matrices = [n for n, t in sd.items() if t.ndim == 2]
    assert len(carried) == len(matrices) == 2 + 2 * 7  # embedding, output; q k v o gate up down a layer
    assert sorted(carried.names) == sorted(matrices)


def test_the_export_quantization_returns_the_files_blocks(q4_0_checkpoint):
    """Through torchao, every Q4_0 matrix comes back as the file's blocks (values and scales), and
    dequantizes to the checkpoint's weights exactly. Without the carry-over HQQ finds another grid
    for them, which does not give the file's weights back (the contrast this test rests on)."""
    from app.models.carry import blocks

    reader, sd, carried = q4_0_checkpoint
    by_name = {}
    for t in reader.tensors:
        by_name[t.name] = t
    name = "layers.1.feed_forward.w2.weight"
    hqq = from_hp(sd[name])
    assert not torch.equal(hqq.dequantize(), sd[name]), "HQQ alone keeps the file's weights: nothing to show"
    before = carried.carried
    with carried.active():
        for n, w in sd.items():
            if w.ndim != 2:
                continue
            qt = from_hp(w)
            assert torch.equal(qt.dequantize(), w), n
    assert carried.carried - before == len(carried)
    q, d = blocks(by_name["blk.1.ffn_down.weight"], (0, 64))
    with carried.active():
        qt = from_hp(sd[name])
    np.testing.assert_array_equal(qt.qdata.numpy(), q)
    np.testing.assert_array_equal(qt.scale.reshape(d.shape).numpy(), d)


def test_what_is_not_a_q4_0_weight_is_quantized_as_before(q4_0_checkpoint):
    """A weight a fold changed (as the key smoothing changes wk), another group size or an 8-bit
    range goes on to the function the carry-over wraps; so does a stochastic rounding."""
    reader, sd, carried = q4_0_checkpoint
    w = sd["layers.0.attention.wk.weight"]
    calls = []

    def library(hp_tensor, block_size, qmin, qmax, **kwargs):
        calls.append((tuple(hp_tensor.shape), tuple(block_size), qmin, qmax))
        return torch.zeros_like(hp_tensor, dtype=torch.int32), torch.ones(hp_tensor.shape[0], 1)

    f = carried.wrap(library)
    assert f(w, [1, 32], -8, 7)[0].abs().sum() > 0 and not calls  # the file's own blocks
    f(w * 1.5, [1, 32], -8, 7)
    f(w, [1, 64], -8, 7)
    f(w, [1, 32], -128, 127)
    f(w, [1, 32], -8, 7, stochastic=True)
    f(w.to(torch.bfloat16), [1, 32], -8, 7)
    assert len(calls) == 5


def test_a_file_without_q4_0_carries_nothing(tmp_path):
    from app.models.carry import CarriedBlocks
    from app.models.checkpoint import stream
    from app.models.gguf_file import file_spec
    from app.models.gguf_meta import open_gguf

    path = write_tiny(tmp_path / "tiny-f32.gguf", "llama", layers=1, dim=64, heads=4, kv_heads=2, hidden=128)
    reader = open_gguf(path)
    carried = CarriedBlocks()
    stream(reader, file_spec(path, reader), tmp_path / "checkpoint.pth", carried).finish()
    assert len(carried) == 0


@pytest.mark.slow
def test_a_q4_0_gguf_builds_with_its_blocks_and_serves_its_logits(tmp_path):
    """`build-gguf` on a Q4_0 llama with an int8 cache: every Q4_0 weight is carried over (the
    manifest says so), the smoothed wq and wk with their rows' factors; the
    output projection, 2,051 rows (not a multiple of 4: XNNPACK runs it), has negative scales, so
    it is quantized again, and the program loads (XNNPACK refuses a negative scale at load); its
    logits follow transformers' on the same file (which dequantizes the blocks exactly): what is
    left is the int8 activations' rounding and the one requantized projection."""
    import json

    from models.test_gguf_architectures import TOKENS, build, our_logits, reference_logits, rel_diff

    gguf = write_tiny(tmp_path / "tiny-q4_0.gguf", "llama", layers=2, dim=64, heads=4, kv_heads=2, hidden=128,
                      weight_type="Q4_0", tied=False, name="Tiny Q4_0")
    model_dir = build(gguf, tmp_path / "cache", "--quantize", "8da4w", "--embedding-quantize", "4bit",
                      "--kv-cache", "int8")
    manifest = json.loads((model_dir / "etserve.json").read_text())
    # the int8 cache's key smoothing scales wq's and wk's rows: carried with scaled blocks
    assert manifest["q4_0_carried"] == {"carried": 16, "q4_0_weights": 16, "requantized_for_xnnpack": 1,
                                        "scaled_by_a_fold": 4}
    assert manifest["hqq"]["computed"] == 1  # the output projection only
    ours = our_logits(model_dir, TOKENS)
    ref = reference_logits(gguf, TOKENS)
    diff = rel_diff(ours, ref)
    print(f"Q4_0 carried over: max abs logit diff / max |logit| vs transformers: {diff:.3f}")
    assert ours.argmax() == ref.argmax() and diff < 0.1


def test_a_fold_that_scales_rows_keeps_the_blocks(tmp_path):
    """The key smoothing's fold (kv_smoothing.apply_factors: wq's rows times factors, wk's divided)
    leaves each row on its grid: the weight is carried over with its blocks' scales times the
    row's factor. A change that is not a scaling of rows goes to HQQ."""
    from app.models import kv_smoothing
    from app.models.carry import CarriedBlocks, blocks
    from app.models.checkpoint import make_params, stream
    from app.models.gguf_file import file_spec
    from app.models.gguf_meta import open_gguf, read_metadata

    path = write_tiny(tmp_path / "tiny-q4_0.gguf", "llama", layers=1, dim=64, heads=4, kv_heads=2, hidden=128,
                      weight_type="Q4_0")
    reader = open_gguf(path)
    spec = file_spec(path, reader)
    carried = CarriedBlocks()
    streamed = stream(reader, spec, tmp_path / "checkpoint.pth", carried)
    sd = streamed.state_dict
    params = make_params(read_metadata(reader), spec, has_qkv_bias=False)
    factors = torch.exp(torch.randn(1, 2, 16) * 0.5)  # [layers, kv heads, head_dim]
    kv_smoothing.apply_factors(sd, factors, params)
    sd["layers.0.feed_forward.w1.weight"] = sd["layers.0.feed_forward.w1.weight"] + 1e-3  # not a row scaling
    streamed.finish()
    assert carried.refolded == 2
    by_name = {t.name: t for t in reader.tensors}
    before = carried.carried
    with carried.active():
        wk = from_hp(sd["layers.0.attention.wk.weight"])
        w1 = from_hp(sd["layers.0.feed_forward.w1.weight"])
    assert carried.carried - before == 1
    q, d = blocks(by_name["blk.0.attn_k.weight"], (0, 32))
    np.testing.assert_array_equal(wk.qdata.numpy(), q)
    expected = d / factors.reshape(-1).numpy()[:, None]
    np.testing.assert_allclose(wk.scale.reshape(d.shape).numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(wk.dequantize().numpy(), sd["layers.0.attention.wk.weight"].numpy(), rtol=1e-6,
                               atol=1e-9)
    assert not torch.allclose(w1.dequantize(), sd["layers.0.feed_forward.w1.weight"], rtol=1e-6, atol=1e-9)
