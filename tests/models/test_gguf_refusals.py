"""A GGUF we cannot build is refused by name, from its header, in seconds (issue 36).

The files are tiny synthetic GGUFs written with the ``gguf`` package: an architecture we have no
family for, and a gemma3 file holding a tensor in a type we do not dequantize.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from app.models.arch import UnsupportedGGUF, check_gguf  # noqa: E402


def _write(path, arch: str, tensors: dict) -> None:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    for name, (data, raw_dtype) in tensors.items():
        w.add_tensor(name, data, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _refusal(path) -> str:
    started = time.monotonic()
    with pytest.raises(UnsupportedGGUF) as info:
        check_gguf(path)
    assert time.monotonic() - started < 5
    message = str(info.value)
    assert "\n" not in message
    return message


def test_unsupported_architecture_is_named(tmp_path):
    path = tmp_path / "mamba.gguf"
    _write(path, "mamba", {"token_embd.weight": (np.zeros((8, 32), np.float32), None)})
    message = _refusal(path)
    assert "unsupported GGUF architecture 'mamba'" in message
    assert "gemma3" in message and "llama" in message  # what is supported


def test_unsupported_tensor_type_is_named(tmp_path):
    path = tmp_path / "iq.gguf"
    qt = gguf.GGMLQuantizationType.IQ2_XXS
    block, type_size = gguf.GGML_QUANT_SIZES[qt]
    rows = 4  # one block per row
    raw = np.zeros((rows, type_size), np.uint8)  # a byte tensor shaped as the quantized rows
    _write(path, "gemma3", {
        "token_embd.weight": (np.zeros((8, 32), np.float32), None),
        "blk.0.attn_q.weight": (raw, qt),
    })
    message = _refusal(path)
    assert "unsupported GGUF tensor type IQ2_XXS" in message
    assert "blk.0.attn_q.weight" in message


def test_supported_file_passes(tmp_path):
    path = tmp_path / "llama.gguf"
    _write(path, "llama", {
        "token_embd.weight": (np.zeros((8, 32), np.float32), None),
        "blk.0.attn_q.weight": (np.zeros((32, 32), np.float16), None),
    })
    assert check_gguf(path) == "llama"


def test_gemma3_layer_pattern_and_window_mask():
    """Layers 5, 11, 17 global; a sliding layer's mask row for query q lets keys q-511..q through."""
    import math

    from app.models.arch import gemma3

    md = {"general.architecture": "gemma3", "gemma3.block_count": 18}
    types = gemma3.layer_types(md)
    assert [i for i, t in enumerate(types) if t == gemma3.GLOBAL] == [5, 11, 17]
    rows = gemma3._WindowMask(512, 1024).narrow(0, 600, 2)
    assert tuple(rows.shape) == (2, 1024)
    for r, q in enumerate((600, 601)):
        visible = [k for k in range(1024) if rows[r, k].item() == 0.0]
        assert visible == list(range(q - 511, q + 1))
        assert all(math.isinf(rows[r, k].item()) for k in range(1024) if k not in visible)


def test_build_gguf_refuses_before_any_heavy_work(tmp_path):
    """`python -m app.models build-gguf FILE` (what `etserve --model FILE.gguf` runs): one line, exit 2."""
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path / "mamba.gguf"
    _write(path, "mamba", {"token_embd.weight": (np.zeros((8, 32), np.float32), None)})
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "app.models", "build-gguf", str(path)], capture_output=True,
                          text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert time.monotonic() - started < 30  # interpreter start and imports; no torch
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == "build-gguf: mamba.gguf: unsupported GGUF architecture 'mamba' " \
                                  "(supported: llama, qwen2, qwen3, phi3, gemma3)"
    assert proc.stdout == ""


def _bad_files(tmp_path):
    """name -> (path, what the one line must say)"""
    rnd = tmp_path / "random.gguf"
    rnd.write_bytes(bytes(range(256)) * 4)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    short = tmp_path / "short.gguf"
    short.write_bytes(b"GGUF\x03\x00\x00\x00")
    cut = tmp_path / "cut.gguf"  # a real header cut in the middle of its key/value fields
    _write(tmp_path / "whole.gguf", "llama", {"token_embd.weight": (np.zeros((8, 32), np.float32), None)})
    cut.write_bytes((tmp_path / "whole.gguf").read_bytes()[:60])
    folder = tmp_path / "folder.gguf"
    folder.mkdir()
    untokenized = tmp_path / "untokenized.gguf"  # a supported architecture without a tokenizer
    _write(untokenized, "llama", {"token_embd.weight": (np.zeros((8, 32), np.float32), None)})
    return {"random": (rnd, "random.gguf is not a GGUF file"),
            "empty": (empty, "empty.gguf is empty, not a GGUF file"),
            "short": (short, "short.gguf: a truncated or corrupt GGUF header"),
            "cut": (cut, "cut.gguf: a truncated or corrupt GGUF header"),
            "folder": (folder, "Is a directory"),
            "untokenized": (untokenized, "untokenized.gguf: no tokenizer or eos token in the GGUF")}


@pytest.mark.parametrize("name", ["random", "empty", "short", "cut", "folder", "untokenized"])
def test_a_file_that_is_no_buildable_gguf_gets_one_line(tmp_path, name):
    """Not a GGUF, empty, cut short, a directory, no tokenizer: `build-gguf` (so `etserve --model
    FILE.gguf`) says so in one line and exits 2, never a traceback."""
    import subprocess
    import sys
    from pathlib import Path

    path, says = _bad_files(tmp_path)[name]
    proc = subprocess.run([sys.executable, "-m", "app.models", "build-gguf", str(path)], capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("build-gguf: ") and says in lines[-1], proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
