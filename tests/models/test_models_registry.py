"""Registry, options, paths and the CLI's pure commands."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from app.models import registry
from app.models.__main__ import main
from app.models.build import manifest_matches
from app.models.checkpoint import executorch_name
from app.models.registry import BuildOptions, resolve_options


def test_variants():
    assert BuildOptions(2048, "none", False).variant == "ctx2048-fp32"
    assert BuildOptions(512, "8da4w", True).variant == "ctx512-8da4w-lq4-sdpa"
    assert BuildOptions(2048, "8da4w", True, "4bit").variant == "ctx2048-8da4w-e4-lq4-sdpa"
    assert BuildOptions(32768, "8da4w", True, "4bit", "int8").variant == "ctx32768-8da4w-e4-lq4-sdpa-kv8"
    assert BuildOptions(32768, "8da4w", True, "4bit", "int8", "8bit").variant == "ctx32768-8da4w-e4-o8-lq4-sdpa-kv8"
    assert BuildOptions(32768, "8da4w", True, "4bit", "int8", "8bit", "xnnpack").variant == \
        "ctx32768-8da4w-e4-o8-sdpa-kv8"
    assert BuildOptions(512, "none", True, logit_rows=32).variant == "ctx512-fp32-sdpa-r32"


def test_defaults():
    smol = resolve_options("smollm2-135m")
    qwen = resolve_options("qwen2.5-coder-0.5b")
    assert (smol.max_seq_len, smol.quantize, smol.custom_ops) == (2048, "none", registry.DEFAULT_CUSTOM_OPS)
    assert (qwen.quantize, registry.MODELS["qwen2.5-coder-0.5b"].group_size) == ("8da4w", 32)
    assert qwen.max_seq_len == 32768  # what Qwen2.5-Coder was trained for
    assert (qwen.kv_cache, smol.kv_cache) == ("int8", "fp32")  # Qwen: int8 with smoothed keys
    assert (qwen.output_quantize, smol.output_quantize) == ("8bit", "same")
    assert qwen.variant == "ctx32768-8da4w-e4-o8-lq4-sdpa-kv8-r32"  # a rows build (batching, drafts)
    assert (qwen.logit_rows, smol.logit_rows) == (registry.DEFAULT_LOGIT_ROWS, registry.DEFAULT_LOGIT_ROWS)
    assert resolve_options("qwen2.5-coder-0.5b", custom_ops=False).logit_rows == 0  # our kernels read the rows
    assert resolve_options("gemma3-270m").logit_rows == 0  # its window mask is narrowed from one start
    assert qwen.linear_kernel == "etserve"  # our 4-bit linear kernel (native/src/linear_q4.cpp)
    assert resolve_options("qwen2.5-coder-0.5b", linear_kernel="xnnpack").variant == "ctx32768-8da4w-e4-o8-sdpa-kv8-r32"
    assert resolve_options("qwen2.5-coder-0.5b", custom_ops=False).linear_kernel == "xnnpack"
    with pytest.raises(ValueError):  # our kernel is registered by the library the custom ops live in
        resolve_options("qwen2.5-coder-0.5b", custom_ops=False, linear_kernel="etserve")
    with pytest.raises(ValueError):
        resolve_options("qwen2.5-coder-0.5b", linear_kernel="cublas")
    assert resolve_options("qwen2.5-coder-0.5b", custom_ops=False).kv_cache == "fp32"
    assert resolve_options("qwen2.5-coder-0.5b", 4096).max_seq_len == 4096
    assert (qwen.embedding_quantize, smol.embedding_quantize) == ("4bit", "none")
    assert resolve_options("smollm2-135m", 512, "8da4w", True) == BuildOptions(512, "8da4w", True, logit_rows=32)
    with pytest.raises(ValueError):
        resolve_options("smollm2-135m", quantize="int3")
    with pytest.raises(ValueError):
        resolve_options("smollm2-135m", embedding_quantize="2bit")
    with pytest.raises(KeyError):
        resolve_options("nope")
    with pytest.raises(ValueError):
        resolve_options("smollm2-135m", kv_cache="int4")
    with pytest.raises(ValueError):  # the quantized cache is only written by the custom ops
        resolve_options("smollm2-135m", custom_ops=False, kv_cache="int8")
    # the 8-bit output projection goes with 8da4w only; another --quantize drops the default
    assert resolve_options("qwen2.5-coder-0.5b", quantize="none").output_quantize == "same"
    assert resolve_options("smollm2-135m", 512, "8da4w").output_quantize == "same"
    assert resolve_options("smollm2-135m", 512, "8da4w", output_quantize="8bit").output_quantize == "8bit"
    with pytest.raises(ValueError):
        resolve_options("smollm2-135m", output_quantize="8bit")
    with pytest.raises(ValueError):
        resolve_options("qwen2.5-coder-0.5b", output_quantize="2bit")


def test_eos_ids():
    assert registry.MODELS["smollm2-135m"].eos_token_ids == (2,)
    assert set(registry.MODELS["qwen2.5-coder-0.5b"].eos_token_ids) == {151645, 151643}


def test_paths(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("ETSERVE_CACHE", str(tmp_path))
    assert registry.default_model_dir("smollm2-135m") == tmp_path / "models" / "smollm2-135m" / "ctx2048-fp32-sdpa-r32"
    assert main(["path", "qwen2.5-coder-0.5b", "--max-seq-len", "512"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "models/qwen2.5-coder-0.5b/ctx512-8da4w-e4-o8-lq4-sdpa-kv8-r32")
    assert main(["path", "qwen2.5-coder-0.5b", "--no-custom-ops", "--embedding-quantize", "none"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "models/qwen2.5-coder-0.5b/ctx32768-8da4w-o8")
    assert main(["path", "smollm2-135m", "--out", str(tmp_path / "x")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "x")


def test_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m" in out and "qwen2.5-coder-0.5b" in out


def test_registry_import_is_light():
    code = "import sys, app.models, app.models.registry; print(sorted(m for m in ('torch','executorch','gguf','transformers','tokenizers','numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_manifest_matches():
    spec = registry.MODELS["qwen2.5-coder-0.5b"]
    opts = BuildOptions(2048, "8da4w", False, linear_kernel="xnnpack")
    m = {"manifest_version": 1, "name": spec.name, "max_seq_len": 2048, "quantize": "8da4w",
         "custom_ops": False, "group_size": 32}
    assert manifest_matches(m, spec, opts)
    # a manifest without linear_kernel is an XNNPACK build: one for our kernel is rebuilt
    lq4 = BuildOptions(2048, "8da4w", True)
    ml = dict(m, custom_ops=True)
    assert not manifest_matches(ml, spec, lq4)
    assert manifest_matches(dict(ml, linear_kernel="etserve"), spec, lq4)
    assert not manifest_matches(dict(ml, linear_kernel="etserve"), spec, dataclasses.replace(lq4, linear_kernel="xnnpack"))
    # an fp32 build has no 4-bit linears: the kernel choice does not matter
    fp = BuildOptions(2048, "none", True)
    assert manifest_matches(dict(ml, quantize="none", group_size=None), spec, fp)
    assert not manifest_matches(dict(m, custom_ops=True), spec, opts)
    assert not manifest_matches(dict(m, embedding_quantize="4bit"), spec, opts)
    assert not manifest_matches(dict(m, kv_cache="int8"), spec, opts)
    assert manifest_matches(dict(m, kv_cache="fp32"), spec, opts)
    assert not manifest_matches(dict(m, output_quantize="8bit"), spec, opts)
    assert not manifest_matches(None, spec, opts)
    o8 = BuildOptions(2048, "8da4w", False, output_quantize="8bit", linear_kernel="xnnpack")
    assert manifest_matches(dict(m, output_quantize="8bit"), spec, o8) and not manifest_matches(m, spec, o8)
    # int8 caches: only builds with smoothed keys (older int8 builds are rebuilt)
    kv8 = BuildOptions(2048, "8da4w", False, kv_cache="int8", linear_kernel="xnnpack")
    assert not manifest_matches(dict(m, kv_cache="int8"), spec, kv8)
    assert manifest_matches(dict(m, kv_cache="int8", kv_smoothing={"alpha": 0.75}), spec, kv8)


def test_tensor_names():
    assert executorch_name("token_embd.weight") == "tok_embeddings.weight"
    assert executorch_name("output_norm.weight") == "norm.weight"
    assert executorch_name("blk.7.attn_q.bias") == "layers.7.attention.wq.bias"
    assert executorch_name("blk.0.ffn_gate.weight") == "layers.0.feed_forward.w1.weight"
    assert executorch_name("blk.0.ffn_down.weight") == "layers.0.feed_forward.w2.weight"
    with pytest.raises(KeyError):
        executorch_name("blk.0.mystery.weight")
