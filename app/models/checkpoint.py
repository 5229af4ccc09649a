"""GGUF -> dequantized fp32 checkpoint and ``params.json`` in ExecuTorch's llama naming (build time).

The checkpoint is streamed: each GGUF tensor is dequantized a few MB of rows at a time straight
into a ``torch.save``-format file, and the state dict the folds see (the family's, the int8 KV
cache's key smoothing) is tensors over a shared map of that file. The fp32 model is 4 bytes a
weight, 30 GB for a 7B: held in anonymous memory (as an in-RAM dict, then ``torch.save``'s
copy) it does not fit a 24 GB machine; as file pages, which the kernel drops and reads back
as it needs, it does, and ExecuTorch's loader maps the same file (``torch.load(mmap=True)``,
meta-device model, ``load_state_dict(assign=True)``), so no stage copies it into RAM. The
quantization then holds the quantized model plus one linear's transient work.
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from .arch import family
from .gguf_meta import arch_value
from .registry import ModelSpec

# GGUF tensor name -> ExecuTorch llama_transformer name ("{}" is the layer index).
_GLOBAL_NAMES = {
    "token_embd.weight": "tok_embeddings.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "output.weight",
}
# Tensors that are rope parameters, not weights: read apart (``rope_tensors``) into params.json.
# rope_freqs: Llama 3's rope scaling (arch/llama3_rope.py); rope_factors_*: LongRoPE (arch/phi3.py).
ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_short.weight", "rope_factors_long.weight")
_LAYER_NAMES = {
    "attn_norm.weight": "attention_norm.weight",
    "attn_q.weight": "attention.wq.weight",
    "attn_q.bias": "attention.wq.bias",
    "attn_k.weight": "attention.wk.weight",
    "attn_k.bias": "attention.wk.bias",
    "attn_v.weight": "attention.wv.weight",
    "attn_v.bias": "attention.wv.bias",
    "attn_output.weight": "attention.wo.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "ffn_gate.weight": "feed_forward.w1.weight",
    "ffn_down.weight": "feed_forward.w2.weight",
    "ffn_up.weight": "feed_forward.w3.weight",
}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.(.+)$")


def executorch_name(gguf_name: str, extra: Optional[dict[str, str]] = None) -> str:
    """ExecuTorch llama parameter name for a GGUF tensor name (``extra``: the architecture
    family's own per-layer names, app/models/arch)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.match(gguf_name)
    if m:
        names = {**_LAYER_NAMES, **(extra or {})}
        if m.group(2) in names:
            return f"layers.{m.group(1)}.{names[m.group(2)]}"
    raise KeyError(f"unexpected GGUF tensor {gguf_name!r}")


def weight_parts(gguf_name: str, shape: tuple[int, ...], fam=None) -> list[tuple[str, int, int]]:
    """(ExecuTorch name, first row, end row) of each weight a GGUF tensor of PyTorch ``shape`` holds:
    one, all its rows, unless it is one of the family's ``FUSED`` tensors (phi3's attn_qkv, ffn_up),
    whose function gives each part's name and rows from the shape."""
    fused = getattr(fam, "FUSED", None)
    m = _LAYER_RE.match(gguf_name)
    if fused and m and m.group(2) in fused:
        return [(f"layers.{m.group(1)}.{name}", a, b) for name, a, b in fused[m.group(2)](shape)]
    return [(executorch_name(gguf_name, fam.LAYER_NAMES if fam is not None else None), 0, shape[0])]


def rope_tensors(reader) -> dict[str, Any]:
    """The file's ``ROPE_TENSORS`` by GGUF name, as fp32 torch vectors (a few hundred values)."""
    import numpy as np
    import torch
    from gguf.quants import dequantize

    return {t.name: torch.from_numpy(np.array(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(-1))
            for t in reader.tensors if t.name in ROPE_TENSORS}


def make_params(md: dict[str, Any], spec: ModelSpec, has_qkv_bias: bool,
                rope: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """``params.json`` content (ExecuTorch ``ModelArgs``) from GGUF metadata and the file's
    ``rope_tensors`` (``rope``: Llama 3's rope scaling, LongRoPE)."""
    arch = md["general.architecture"]
    if arch != spec.architecture:
        raise ValueError(f"GGUF architecture {arch!r}, expected {spec.architecture!r}")
    dim = int(arch_value(md, "embedding_length"))
    n_heads = int(arch_value(md, "attention.head_count"))
    vocab = arch_value(md, "vocab_size") or len(md["tokenizer.ggml.tokens"])
    params = {
        "dim": dim,
        "n_layers": int(arch_value(md, "block_count")),
        "n_heads": n_heads,
        "n_kv_heads": int(arch_value(md, "attention.head_count_kv", n_heads)),
        "head_dim": int(arch_value(md, "rope.dimension_count", dim // n_heads)),
        "vocab_size": int(vocab),
        "hidden_dim": int(arch_value(md, "feed_forward_length")),
        "norm_eps": float(arch_value(md, "attention.layer_norm_rms_epsilon")),
        "rope_theta": float(arch_value(md, "rope.freq_base", 10000.0)),
        "use_scaled_rope": False,
        "use_hf_rope": spec.use_hf_rope,
        "attention_qkv_bias": has_qkv_bias,
    }
    fam = family(arch)
    if fam is not None:
        fam.update_params(md, params)
    rope = rope or {}
    if "rope_freqs.weight" in rope:
        from .arch import UnsupportedGGUF, llama3_rope

        if params["use_hf_rope"]:  # ExecuTorch scales only its interleaved (llama) rope
            raise UnsupportedGGUF(f"{arch}: rope_freqs.weight (rope scaling) is supported for llama only")
        params.update(llama3_rope.scaling_params(md, rope["rope_freqs.weight"], params["head_dim"],
                                                 params["rope_theta"]))
    if any(name.startswith("rope_factors_") for name in rope):
        if not hasattr(fam, "longrope_params"):
            from .arch import UnsupportedGGUF

            raise UnsupportedGGUF(f"{arch}: LongRoPE factors are supported for phi3 only")
        fam.longrope_params(md, rope, params)
    return params


def _layout(reader, spec: ModelSpec) -> list[tuple[str, Any, tuple[int, ...], tuple[int, int]]]:
    """(ExecuTorch name, GGUF tensor, PyTorch (out, in) shape, (first, end) row of the tensor) of
    every weight, in file order: a family's fused tensor (phi3's attn_qkv) gives one entry per part
    (``weight_parts``), the rope tensors none (``rope_tensors``), and a tied output projection is
    its own entry, a second copy of the embedding table."""
    fam = family(spec.architecture)
    layout = []
    for t in reader.tensors:
        if t.name in ROPE_TENSORS:
            continue
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        for name, a, b in weight_parts(t.name, shape, fam):
            layout.append((name, t, (b - a,) + shape[1:], (a, b)))
    names = {name: (t, shape, span) for name, t, shape, span in layout}
    if "output.weight" not in names:
        if not spec.tied_output:
            raise ValueError(f"{spec.name}: GGUF has no output.weight but model is not tied")
        layout.append(("output.weight", *names["tok_embeddings.weight"]))
    elif spec.tied_output:
        raise ValueError(f"{spec.name}: GGUF has a separate output.weight but model is declared tied")
    return layout


def _dequantized_rows(t, rows: int, span: tuple[int, int]):
    """Rows span[0]..span[1] of a GGUF tensor dequantized to fp32, ``rows`` PyTorch rows at a time."""
    import numpy as np
    from gguf.quants import dequantize

    data = t.data
    if data.ndim == 1:  # a vector (norms, biases)
        yield np.asarray(dequantize(data, t.tensor_type), dtype=np.float32).reshape(1, -1)
        return
    a, b = span
    for r in range(a, b, rows):
        yield np.asarray(dequantize(data[r:min(r + rows, b)], t.tensor_type), dtype=np.float32).reshape(
            min(rows, b - r), -1)


def dequantized_state_dict(reader, spec: ModelSpec) -> dict:
    """All GGUF tensors dequantized to fp32 torch tensors in RAM, in PyTorch (out, in) shape (a tied
    output projection shares the embedding's tensor). What ``write_checkpoint`` streams to disk;
    kept as the reference its tests compare with."""
    import numpy as np
    import torch
    from gguf.quants import dequantize

    sd = {}
    for name, t, _shape, (a, b) in _layout(reader, spec):
        if spec.tied_output and name == "output.weight":
            continue
        full = tuple(int(d) for d in reversed(t.shape.tolist()))
        arr = np.array(dequantize(t.data, t.tensor_type), dtype=np.float32, order="C").reshape(full)  # own copy
        sd[name] = torch.from_numpy(arr if (a, b) == (0, full[0]) else arr[a:b].copy())
    if spec.tied_output:
        sd["output.weight"] = sd["tok_embeddings.weight"]
    return sd


# A checkpoint is written as ``torch.save`` writes one (a zip of stored records: the pickled dict,
# then each tensor's bytes, 64-byte aligned), but one tensor at a time and a few MB of rows at a
# time: the fp32 model (4 bytes a weight, 30 GB for a 7B) never sits in anonymous memory.
# ``torch.load(..., mmap=True)``, which ExecuTorch's loader calls, maps it back.
_CHUNK_BYTES = 32 << 20
_ALIGN = 64  # torch.save's storage alignment (.storage_alignment)


class _Storage:
    """Stands for one float32 storage in the pickled dict (``persistent_id`` names its record)."""

    def __init__(self, key: str, numel: int) -> None:
        self.key, self.numel = key, numel


class _Tensor:
    """Pickles as ``torch.save`` pickles a contiguous float32 tensor over a whole storage."""

    def __init__(self, storage: _Storage, shape: tuple[int, ...]) -> None:
        self.storage, self.shape = storage, shape

    def __reduce__(self):
        import collections

        import torch

        stride, step = [], 1
        for d in reversed(self.shape):
            stride.insert(0, step)
            step *= d
        return (torch._utils._rebuild_tensor_v2,
                (self.storage, 0, tuple(self.shape), tuple(stride), False, collections.OrderedDict()))


def _pickled(names_shapes: list[tuple[str, str, tuple[int, ...]]]) -> bytes:
    import io
    import math
    import pickle

    import torch

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            if isinstance(obj, _Storage):
                return ("storage", torch.FloatStorage, obj.key, "cpu", obj.numel)
            return None

    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump(
        {name: _Tensor(_Storage(key, math.prod(shape)), shape) for name, key, shape in names_shapes})
    return buf.getvalue()


def _aligned_info(zf, arcname: str):
    """A stored entry whose data will start on an ``_ALIGN`` boundary: the local header's extra
    field pads it, as torch's writer does (its ``FB`` field)."""
    import struct
    import zipfile

    info = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    start = zf.fp.tell()
    # 30-byte local header, the name, our field (4 + pad), zipfile's zip64 field (20, force_zip64)
    fixed = 30 + len(arcname.encode()) + 4 + 20
    pad = -(start + fixed) % _ALIGN
    info.extra = struct.pack("<HH", 0x4246, pad) + bytes(pad)
    return info


class StreamedCheckpoint:
    """A checkpoint ``stream`` wrote: ``state_dict``, its tensors over a shared map of the file
    (file-backed pages the kernel may drop and read again, not anonymous memory), and the zip still
    open until ``finish``."""

    def __init__(self, zf, offsets: dict[str, int], state_dict: dict, carried=None) -> None:
        self._zf = zf
        self._carried = carried  # carry.CarriedBlocks: told of the tensors a fold replaced
        self._offsets = offsets  # name -> its data's offset in the file, in record order
        self._mapped = dict(state_dict)  # the tensors first handed out
        self.state_dict = state_dict

    def finish(self) -> None:
        """Close the file: a tensor the folds replaced (a new tensor under its name) is copied into
        its record and that record's CRC-32 recomputed; then the zip's directory is written."""
        import struct
        import zlib

        zf = self._zf
        try:
            infos = {info.filename: info for info in zf.infolist()}
            for key, (name, mapped) in enumerate(self._mapped.items()):
                new = self.state_dict.get(name)
                if new is mapped:
                    continue
                if new is None or tuple(new.shape) != tuple(mapped.shape):
                    raise ValueError(f"{name}: a fold removed it or changed its shape")
                if self._carried is not None:
                    self._carried.refold(name, mapped, new)
                mapped.copy_(new)
                self.state_dict[name] = mapped
                flat = mapped.numpy().reshape(-1)
                crc, step = 0, _CHUNK_BYTES // 4
                for i in range(0, flat.size, step):
                    crc = zlib.crc32(flat[i:i + step], crc)
                info = infos[f"{Path(zf.filename).stem}/data/{key}"]
                info.CRC = crc  # the central directory's copy, written by close()
                zf.fp.flush()
                with open(zf.filename, "r+b") as f:  # the local header's (CRC-32 at byte 14)
                    f.seek(info.header_offset + 14)
                    f.write(struct.pack("<I", crc))
        finally:
            zf.close()


def stream(reader, spec: ModelSpec, path: Path, carried=None) -> StreamedCheckpoint:
    """Write every GGUF tensor, dequantized to fp32, into the ``torch.save`` checkpoint ``path``,
    a few MB of rows at a time; ``carried`` (carry.CarriedBlocks): records the Q4_0 tensors by the
    digest of the bytes written."""
    import math
    import zipfile

    import numpy as np
    import torch

    layout = _layout(reader, spec)
    archive = path.stem
    keys = [(name, str(i), shape) for i, (name, _t, shape, _span) in enumerate(layout)]
    zf = zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True)
    offsets: dict[str, int] = {}
    try:
        for record, data in (("data.pkl", _pickled(keys)), (".format_version", b"1"),
                             (".storage_alignment", str(_ALIGN).encode()), ("byteorder", b"little")):
            zf.writestr(zipfile.ZipInfo(f"{archive}/{record}", date_time=(1980, 1, 1, 0, 0, 0)), data)
        for (name, t, shape, span), (_n, key, _s) in zip(layout, keys):
            info = _aligned_info(zf, f"{archive}/data/{key}")
            rows = max(1, _CHUNK_BYTES // (4 * shape[-1]))
            digest = carried.hasher(t) if carried is not None else None
            with zf.open(info, "w", force_zip64=True) as out:
                offsets[name] = zf.fp.tell()
                for arr in _dequantized_rows(t, rows, span):
                    out.write(arr.tobytes())
                    if digest is not None:
                        digest.update(memoryview(np.ascontiguousarray(arr)).cast("B"))
            if digest is not None:
                carried.add(name, digest.hexdigest(), t, shape, span)
            if offsets[name] % _ALIGN or zf.fp.tell() - offsets[name] != 4 * math.prod(shape):
                raise RuntimeError(f"{name}: record at {offsets[name]} of {zf.fp.tell() - offsets[name]} bytes, "
                                   f"expected {4 * math.prod(shape)} at a multiple of {_ALIGN}")
        zf.writestr(zipfile.ZipInfo(f"{archive}/version", date_time=(1980, 1, 1, 0, 0, 0)), b"3\n")
        zf.fp.flush()
        sd = {name: torch.from_numpy(np.memmap(path, dtype=np.float32, mode="r+", offset=offsets[name],
                                               shape=shape))
              for name, _t, shape, _span in layout}
    except BaseException:
        zf.close()
        raise
    return StreamedCheckpoint(zf, offsets, sd, carried)


@contextlib.contextmanager
def shared_map(checkpoint: Path) -> Iterator[None]:
    """``torch.load(checkpoint, mmap=True)`` (ExecuTorch's loader) maps the file shared, not private.

    A private writable map of a file is copy-on-write: the kernel's overcommit heuristic
    (vm.overcommit_memory 0) charges its whole size, and refuses a 30 GB checkpoint on a 24 GB
    machine (ENOMEM, "unable to mmap"). A shared map is charged nothing: its pages are the page
    cache's. The loader only reads the weights (quantization makes new tensors); a write would
    change this build's scratch file, which is deleted after the build. Other files load as
    before."""
    import mmap

    import torch

    original = torch.load
    target = Path(checkpoint).resolve()

    def load(f, *args, **kwargs):
        if kwargs.get("mmap") and isinstance(f, (str, Path)) and Path(f).resolve() == target:
            with torch.serialization.set_default_mmap_options(mmap.MAP_SHARED):
                return original(f, *args, **kwargs)
        return original(f, *args, **kwargs)

    torch.load = load
    try:
        yield
    finally:
        torch.load = original


def write_checkpoint(reader, md: dict[str, Any], spec: ModelSpec, work_dir: Path, *,
                     fold: Optional[Callable[[dict, dict], None]] = None,
                     carried=None) -> tuple[Path, Path, dict]:
    """Write ``checkpoint.pth`` and ``params.json`` into ``work_dir``; returns their paths and params.

    The checkpoint is streamed tensor by tensor (``stream``): peak memory is one chunk
    of rows plus what the folds compute, whatever the model's size. The family's fold and
    ``fold(state_dict, params)``, if given (int8 KV caches: the key smoothing of kv_smoothing.py),
    change the fp32 weights before the file is closed: a fold replaces a tensor by name, and
    reads the others from the file's map.

    ``carried`` (carry.CarriedBlocks) learns which weights are Q4_0 blocks (``stream``).

    ``work_dir`` must not contain "int8" or "8da4w": the exporter switches to pre-quantized loading
    when the checkpoint path contains those substrings.
    """
    if "int8" in str(work_dir) or "8da4w" in str(work_dir):
        raise ValueError(f"checkpoint dir {work_dir} must not contain 'int8' or '8da4w'")
    ckpt = work_dir / "checkpoint.pth"
    params_path = work_dir / "params.json"
    streamed = stream(reader, spec, ckpt, carried)
    sd = streamed.state_dict
    try:
        params = make_params(md, spec, has_qkv_bias="layers.0.attention.wq.bias" in sd, rope=rope_tensors(reader))
        fam = family(spec.architecture)
        if fam is not None:
            fam.fold(sd, params)
        if fold is not None:
            fold(sd, params)
    finally:
        streamed.finish()
    params_path.write_text(json.dumps(params, indent=2))
    return ckpt, params_path, params
