"""A tiny LLM-shaped .pte exported WITHOUT the LLM custom ops: its KV caches are plain mutable
buffers written by index_copy_, so the native side never finds them (ets_kv_info says
ETS_ERR_UNSUPPORTED) and sessions must switch themselves off. Exported in a subprocess (the
exporter's torch-linked kernels must not share a process with libetserve.so) in well under a minute.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

VOCAB, SMAX = 256, 64

EXPORT_SCRIPT = textwrap.dedent(r'''
    import sys
    import torch
    from executorch.exir import to_edge_transform_and_lower, EdgeCompileConfig
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    out = sys.argv[1]
    VOCAB, H, HKV, D, SMAX = int(sys.argv[2]), 4, 2, 8, int(sys.argv[3])
    DIM = H * D

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(VOCAB, DIM)
            self.wq = torch.nn.Linear(DIM, DIM, bias=False)
            self.wk = torch.nn.Linear(DIM, HKV * D, bias=False)
            self.wv = torch.nn.Linear(DIM, HKV * D, bias=False)
            self.out = torch.nn.Linear(DIM, VOCAB, bias=False)
            self.register_buffer("k_cache", torch.zeros(1, SMAX, HKV, D))
            self.register_buffer("v_cache", torch.zeros(1, SMAX, HKV, D))
            self.register_buffer("mask", torch.full((SMAX, SMAX), float("-inf")).triu(1), persistent=False)

        def forward(self, tokens, input_pos):
            S = tokens.shape[1]
            x = self.emb(tokens)
            q = self.wq(x).view(1, S, H, D).transpose(1, 2)
            start = input_pos[0].item()
            torch._check_is_size(start)
            torch._check(start + S <= SMAX)
            pos = torch.arange(S) + start
            self.k_cache.index_copy_(1, pos, self.wk(x).view(1, S, HKV, D))
            self.v_cache.index_copy_(1, pos, self.wv(x).view(1, S, HKV, D))
            k = self.k_cache.transpose(1, 2).repeat_interleave(H // HKV, dim=1)
            v = self.v_cache.transpose(1, 2).repeat_interleave(H // HKV, dim=1)
            scores = q @ k.transpose(2, 3) / D ** 0.5 + self.mask.narrow(0, start, S)
            y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(1, S, DIM)
            return self.out(y[:, -1, :])

    torch.manual_seed(0)
    model = Tiny().eval()
    seq = torch.export.Dim("seq", min=1, max=SMAX - 1)
    with torch.no_grad():
        ep = torch.export.export(model, (torch.zeros(1, 2, dtype=torch.long), torch.tensor([0])),
                                 dynamic_shapes=({1: seq}, None), strict=False)
    edge = to_edge_transform_and_lower(
        ep, partitioner=[XnnpackPartitioner()], compile_config=EdgeCompileConfig(_check_ir_validity=False),
        constant_methods={"get_max_seq_len": SMAX, "get_vocab_size": VOCAB, "use_kv_cache": True,
                          "enable_dynamic_shape": True, "get_eos_ids": [1]})
    with open(out, "wb") as f:
        f.write(edge.to_executorch().buffer)
''')


def export(path: Path) -> Path:
    """Writes the .pte to `path` (a file name) and returns it; raises with the exporter's output."""
    proc = subprocess.run([sys.executable, "-c", EXPORT_SCRIPT, str(path), str(VOCAB), str(SMAX)],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError("export of the tiny portable model failed:\n" + proc.stderr[-4000:])
    return path
