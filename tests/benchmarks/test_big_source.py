"""bench/big_source.py: a GGUF's size is read from its header (how the 7B's part count is found,
not guessed), and the synthesized stand-in's blocks dequantize to weights like a real model's."""

from __future__ import annotations

import pytest

np = pytest.importorskip("numpy")
pytest.importorskip("gguf")

from bench.big_source import _blocks, _synth_tensor, gguf_size, tensor_table  # noqa: E402


@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b", "gemma3-270m"])
def test_size_from_the_header_alone(name):
    from app.models.gguf_source import locate_gguf
    from app.models.registry import get_spec

    try:
        path = locate_gguf(get_spec(name))
    except FileNotFoundError as e:
        pytest.skip(str(e))
    with open(path, "rb") as f:
        head = f.read(16 << 20)  # the header and tensor table, not the data
    assert gguf_size(head) == path.stat().st_size
    from app.models.gguf_header import GgufFile  # read as the gguf package reads it (tests/models/test_gguf_reader.py)

    start, tensors = tensor_table(head)
    reader = GgufFile(path)
    assert [(t[0], t[3] + start, t[4]) for t in tensors] == [
        (t.name, int(t.data_offset), int(t.n_bytes)) for t in reader.tensors]


@pytest.mark.parametrize("ttype", [12, 14])  # Q4_K, Q6_K: a Q4_K_M file's quantized types
def test_synthesized_blocks_dequantize_like_weights(ttype):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    rows, cols = 64, 3584
    nbytes = rows * cols // 256 * _blocks()[ttype][1]
    data = _synth_tensor("blk.0.attn_q.weight", ttype, (cols, rows), nbytes, np.random.default_rng(0))
    w = dequantize(np.frombuffer(data, np.uint8).reshape(rows, -1), GGMLQuantizationType(ttype))
    assert w.shape == (rows, cols) and np.isfinite(w).all()
    assert abs(float(w.mean())) < 0.005 and 0.01 < float(w.std()) < 0.05
