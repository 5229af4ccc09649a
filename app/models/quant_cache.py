"""A cache of torchao's HQQ scale search, shared by builds of one model at any context length
(build time; needs torch + torchao).

The 8da4w linears and the 4-bit embedding table are quantized by torchao's
``IntxUnpackedToInt8Tensor.from_hp`` with ``_choose_qparams_and_quantize_scale_only_hqq``: twenty
least-squares passes over every weight, the one step of the export whose result does not depend on
the context length. ``HqqCache.active()`` wraps that function for the duration of an export: each
call is looked up by the content of its weight (a BLAKE2 digest of the bytes, with shape, dtype,
block size and range), computed on a miss (by app/models/hqq.py: the library's values, on both
cores), and replayed on a hit. Everything else the
exporter does runs unchanged, so a build that hits the cache produces the tensors a build that
misses it computes, bit for bit.

One cache file holds a model's results for one set of quantization options and library versions
(``cache_file``); it is written atomically as soon as the weights are quantized, so a build that
fails later (out of memory while lowering, interrupted) does not lose them.

New results are not held in RAM until then: a 7B's are 4.7 GB (4-bit values and a scale per
group), beside the quantized model itself. Every ``SPILL_BYTES`` of them go to a shard file
beside the cache file, mapped back from disk; ``save`` writes the cache from those maps and
deletes the shards; after it, the cache holds no tensors (the export that follows never asks
again). A cache without a file keeps no results at all.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from .quantize_hook import HQQ_FUNCTION, HQQ_MODULE, wrapping_hqq  # noqa: F401  (HQQ_*: tests look them up here)
from .registry import EMBEDDING_GROUP_SIZE, BuildOptions, ModelSpec, cache_root

FORMAT_VERSION = 1
SPILL_BYTES = 256 << 20  # new results kept in RAM before they go to a shard file
# Libraries whose code decides the quantized values (torchao's HQQ, ExecuTorch's quantize transforms).
VERSIONED = ("torch", "torchao", "executorch")


def _version(dist: str) -> Optional[str]:
    try:
        return importlib_metadata.version(dist)
    except importlib_metadata.PackageNotFoundError:
        return None


def cache_fields(spec: ModelSpec, options: BuildOptions, gguf_sha256: str) -> dict[str, Any]:
    """What the cached values depend on (the context length is not among them)."""
    return {
        "format": FORMAT_VERSION,
        "model": spec.name,
        "gguf_sha256": gguf_sha256,
        "quantize": options.quantize,
        "group_size": spec.group_size,
        "embedding_quantize": options.embedding_quantize,
        "embedding_group_size": EMBEDDING_GROUP_SIZE,
        "versions": {d: _version(d) for d in VERSIONED},
    }


def cache_file(spec: ModelSpec, options: BuildOptions, gguf_sha256: str, root: Optional[Path] = None) -> Path:
    """``<cache root>/quant/<model>/<quantization>-<key>.pt``; ``key`` hashes ``cache_fields``."""
    fields = cache_fields(spec, options, gguf_sha256)
    key = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
    quant = options.quantize + ("-e4" if options.embedding_quantize == "4bit" else "")
    return (root or cache_root()) / "quant" / spec.name / f"{quant}-{key}.pt"


def tensor_key(hp_tensor, block_size, qmin: int, qmax: int, kwargs: dict[str, Any]) -> str:
    """Digest of one HQQ call: the weight's bytes, shape and dtype, and the call's parameters."""
    import torch

    t = hp_tensor.detach().contiguous()
    h = hashlib.blake2b(digest_size=20)
    h.update(repr((tuple(t.shape), str(t.dtype), tuple(int(b) for b in block_size), int(qmin), int(qmax),
                   sorted(kwargs.items()))).encode())
    h.update(memoryview(t.view(-1).view(torch.uint8).numpy()))  # hashlib releases the GIL
    return h.hexdigest()


def pack(qdata, scale, qmin: int, qmax: int) -> dict[str, Any]:
    """Store ``qdata`` two values a byte when they fit in 4 bits (int8 otherwise)."""
    import torch

    if -8 <= qmin and qmax <= 7 and qdata.shape[-1] % 2 == 0:
        u = (qdata + 8).to(torch.uint8).reshape(*qdata.shape[:-1], -1, 2)
        return {"q4": (u[..., 0] | (u[..., 1] << 4)).contiguous(), "scale": scale.clone()}
    return {"q8": qdata.to(torch.int8).contiguous(), "scale": scale.clone()}


def unpack(entry: dict[str, Any]):
    """``(qdata int32, scale)`` as the HQQ function returns them."""
    import torch

    if "q4" in entry:
        p = entry["q4"]
        q = torch.stack([p & 0xF, p >> 4], dim=-1).reshape(*p.shape[:-1], -1)
        return q.to(torch.int32) - 8, entry["scale"].clone()
    return entry["q8"].to(torch.int32), entry["scale"].clone()


class HqqCache:
    """The HQQ results of one cache file: ``active()`` serves and records them, ``save()`` writes."""

    def __init__(self, path: Optional[Path]) -> None:
        self.path = path
        self.entries: dict[str, dict[str, Any]] = {}
        self.new: dict[str, dict[str, Any]] = {}  # computed here, in RAM
        self.spilled: dict[str, dict[str, Any]] = {}  # computed here, mapped from shard files
        self._new_bytes = 0
        self._shards: list[Path] = []
        self.hits = 0
        self.misses = 0
        self.seconds = 0.0  # spent in the HQQ function or its replay, hashing included
        if path is not None and path.is_file():
            import torch

            try:
                loaded = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
            except Exception as e:  # a damaged file is recomputed, never trusted
                print(f"ignoring unreadable quantization cache {path}: {e}", flush=True)
            else:
                if isinstance(loaded, dict) and loaded.get("format") == FORMAT_VERSION:
                    self.entries = loaded["entries"]

    def wrap(self, fn: Callable) -> Callable:
        from .hqq import faster

        compute = faster(fn)  # the same values on both cores (app/models/hqq.py)

        def cached_hqq(hp_tensor, block_size, qmin, qmax, **kwargs):
            if kwargs.get("stochastic"):
                return fn(hp_tensor, block_size, qmin, qmax, **kwargs)
            t0 = time.monotonic()
            try:
                key = tensor_key(hp_tensor, block_size, qmin, qmax, kwargs)
                entry = self.entries.get(key) or self.new.get(key) or self.spilled.get(key)
                if entry is not None:
                    self.hits += 1
                    qdata, scale = unpack(entry)
                    return qdata, scale.to(hp_tensor.dtype)
                self.misses += 1
                qdata, scale = compute(hp_tensor, block_size, qmin, qmax, **kwargs)
                if self.path is not None:  # nowhere to save: nothing to keep
                    self._keep(key, pack(qdata, scale, qmin, qmax))
                return qdata, scale
            finally:
                self.seconds += time.monotonic() - t0

        cached_hqq.__wrapped__ = fn
        return cached_hqq

    @contextlib.contextmanager
    def active(self) -> Iterator["HqqCache"]:
        """torchao's HQQ goes through this cache inside the block."""
        with wrapping_hqq(self.wrap):
            yield self

    def _keep(self, key: str, entry: dict[str, Any]) -> None:
        import torch

        self.new[key] = entry
        self._new_bytes += sum(t.numel() * t.element_size() for t in entry.values())
        if self._new_bytes < SPILL_BYTES:
            return
        shard = self.path.with_name(f".{self.path.name}.{os.getpid()}.shard{len(self._shards)}")
        shard.parent.mkdir(parents=True, exist_ok=True)
        self._shards.append(shard)
        torch.save(self.new, shard)
        self.spilled.update(torch.load(shard, map_location="cpu", mmap=True, weights_only=True))
        self.new, self._new_bytes = {}, 0

    def _drop_shards(self) -> None:
        for shard in self._shards:
            shard.unlink(missing_ok=True)
        self._shards = []

    def save(self) -> bool:
        """Write entries and new results to the cache file (atomically); False if nothing new.
        The cache holds no tensors after it."""
        if self.path is None or not (self.new or self.spilled):
            self._drop_shards()
            return False
        import torch

        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        entries = {**self.entries, **self.spilled, **self.new}
        try:
            torch.save({"format": FORMAT_VERSION, "entries": entries}, tmp)
            os.replace(tmp, self.path)
        finally:
            tmp.unlink(missing_ok=True)
            self._drop_shards()
        del entries
        self.entries, self.new, self.spilled, self._new_bytes = {}, {}, {}, 0
        return True

    def __del__(self) -> None:  # a build that failed before save: no shard left behind
        self._drop_shards()

    def summary(self) -> str:
        return f"HQQ: {self.misses} weights computed, {self.hits} replayed from the cache, {self.seconds:.1f}s"
