"""Our staged export (app/models/pipeline.py) writes the program ExecuTorch's ``export_llama``
writes for the same LlmConfig, byte for byte: without the second torch.export (what builds do) and
with it, with HQQ results computed and replayed from the quantization cache. Checked on a tiny random llama (one layer, 8da4w linears, 4-bit embeddings,
the custom sdpa/KV-cache ops: the default build's options) so three exports take minutes.

The exports run in a subprocess: ExecuTorch's custom-op library registers kernels in the runtime
libetserve.so uses, and a second registration aborts.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

SCRIPT = r'''
import json, sys
from pathlib import Path
import torch
from app.models import pipeline
from app.models.export import export_pte, make_llm_config
from app.models.progress import Stages
from app.models.quant_cache import HqqCache
from app.models.registry import BuildOptions

d = Path(sys.argv[1])
dim, hidden, vocab, kv = 64, 128, 256, 32
params = {"dim": dim, "n_layers": 1, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "vocab_size": vocab,
          "hidden_dim": hidden, "norm_eps": 1e-6, "rope_theta": 1e6, "use_scaled_rope": False,
          "use_hf_rope": True, "attention_qkv_bias": True}
g = torch.Generator().manual_seed(0)
def w(*shape, scale=0.1):
    return torch.randn(*shape, generator=g) * scale
sd = {"tok_embeddings.weight": w(vocab, dim, scale=1.0), "norm.weight": w(dim) + 1, "output.weight": w(vocab, dim),
      "layers.0.attention_norm.weight": w(dim) + 1, "layers.0.ffn_norm.weight": w(dim) + 1,
      "layers.0.attention.wq.weight": w(dim, dim), "layers.0.attention.wq.bias": w(dim),
      "layers.0.attention.wk.weight": w(kv, dim), "layers.0.attention.wk.bias": w(kv),
      "layers.0.attention.wv.weight": w(kv, dim), "layers.0.attention.wv.bias": w(kv),
      "layers.0.attention.wo.weight": w(dim, dim), "layers.0.feed_forward.w1.weight": w(hidden, dim),
      "layers.0.feed_forward.w3.weight": w(hidden, dim), "layers.0.feed_forward.w2.weight": w(dim, hidden)}
torch.save(sd, d / "checkpoint.pth")
(d / "params.json").write_text(json.dumps(params))
opts = BuildOptions(max_seq_len=64, quantize="8da4w", custom_ops=True, embedding_quantize="4bit")

def cfg(out):
    return make_llm_config(d / "checkpoint.pth", d / "params.json", opts, group_size=32, bos_id=1, eos_ids=[2],
                           output=out)

report = {}
for run, reexport in (("computed", False), ("replayed", True)):  # builds take the first (build.py)
    cache = HqqCache(d / "hqq.pt")
    stages = Stages(pipeline.STAGES)
    pipeline.export_program(cfg(d / f"{run}.pte"), d / f"{run}.pte", stages, custom_ops=True, hqq_cache=cache,
                            reexport=reexport)
    cache.save()
    report[run] = {"hits": cache.hits, "misses": cache.misses, "stages": [r.label for r in stages.records]}
export_pte(cfg(d / "export_llama.pte"), d / "export_llama.pte", custom_ops=True)
print(json.dumps(report))
'''


def test_staged_export_writes_export_llamas_program(tmp_path):
    for module in ("torch", "executorch.exir", "torchao"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=1800, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    import json

    report = json.loads(proc.stdout.strip().splitlines()[-1])
    # 7 linears in the layer, the output projection and the embedding table; the second export
    # replays all of them.
    assert report["computed"]["misses"] == 9 and report["computed"]["hits"] == 0, report
    assert report["replayed"]["misses"] == 0 and report["replayed"]["hits"] == 9, report
    assert len(report["computed"]["stages"]) == 4
    reference = (tmp_path / "export_llama.pte").read_bytes()
    assert len(reference) > 10_000
    assert (tmp_path / "computed.pte").read_bytes() == reference
    assert (tmp_path / "replayed.pte").read_bytes() == reference
