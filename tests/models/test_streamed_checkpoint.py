"""The checkpoint a build writes is streamed from the GGUF tensor by tensor into ``torch.save``'s
format (app/models/checkpoint.py), so that a 7B (30 GB in fp32) builds on a 24 GB machine: it
holds what the in-RAM dequantization holds, bit for bit, loads with ``torch.load`` mapped or not
(the zip's checksums match, also of a tensor a fold replaced), and the anonymous memory it takes
stays a small fraction of the model's fp32 size."""

from __future__ import annotations

import re
import threading
import time
import zipfile

import pytest

pytest.importorskip("gguf")
torch = pytest.importorskip("torch")

from app.models.arch import family  # noqa: E402
from app.models.checkpoint import dequantized_state_dict, make_params, write_checkpoint  # noqa: E402


@pytest.fixture
def tmp_path(tmp_path):
    """Each checkpoint is GBs: gone after its test, not kept with pytest's last three runs."""
    yield tmp_path
    for f in tmp_path.glob("*.pth"):
        f.unlink()


def _anon_mb() -> float:
    with open("/proc/self/status") as f:
        return int(re.search(r"^RssAnon:\s+(\d+) kB", f.read(), re.M).group(1)) / 1024


class _AnonPeak:
    """The peak of this process's anonymous resident memory over a block, sampled every 10 ms."""

    def __enter__(self):
        self.start = self.peak = _anon_mb()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._done.wait(0.01):
            self.peak = max(self.peak, _anon_mb())

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, _anon_mb())

    @property
    def growth_mb(self) -> float:
        return self.peak - self.start


@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b", "gemma3-270m"])
def test_the_streamed_checkpoint_is_the_in_ram_dequantization_bit_for_bit(name, gguf_metadata, tmp_path):
    """Qwen: separate output projection, q/k/v biases; Gemma 3: a tied output projection (its own
    record) and the family's fold, which replaces the embedding table by a scaled one."""
    spec, _path, reader, md = gguf_metadata(name)
    ckpt, _params_path, params = write_checkpoint(reader, md, spec, tmp_path)
    loaded = torch.load(ckpt, mmap=True, weights_only=True)
    expected = dequantized_state_dict(reader, spec)
    fam = family(spec.architecture)
    if fam is not None:
        fam.fold(expected, params)
    assert sorted(loaded) == sorted(expected)
    for key, value in expected.items():
        assert loaded[key].dtype == torch.float32 and loaded[key].shape == value.shape, key
        assert torch.equal(loaded[key], value), key
    # every record's CRC-32 is right, the replaced embedding's too (zipfile checks on reading)
    with zipfile.ZipFile(ckpt) as z:
        assert z.testzip() is None
    # and torch's unmapped load reads it as well
    assert torch.equal(torch.load(ckpt, weights_only=True)["norm.weight"], expected["norm.weight"])


def test_a_fold_replacing_tensors_lands_in_the_file(gguf_metadata, tmp_path):
    """The key smoothing's way: tensors replaced by name (computed from the mapped ones)."""
    spec, _path, reader, md = gguf_metadata("qwen2.5-coder-0.5b")

    def fold(sd, params):
        sd["layers.3.attention.wk.weight"] = sd["layers.3.attention.wk.weight"] * 2
        sd["layers.3.attention.wk.bias"] = sd["layers.3.attention.wk.bias"] - 1

    ckpt, _, _ = write_checkpoint(reader, md, spec, tmp_path, fold=fold)
    loaded = torch.load(ckpt, mmap=True, weights_only=True)
    expected = dequantized_state_dict(reader, spec)
    assert torch.equal(loaded["layers.3.attention.wk.weight"], expected["layers.3.attention.wk.weight"] * 2)
    assert torch.equal(loaded["layers.3.attention.wk.bias"], expected["layers.3.attention.wk.bias"] - 1)
    assert torch.equal(loaded["layers.4.attention.wk.weight"], expected["layers.4.attention.wk.weight"])
    with zipfile.ZipFile(ckpt) as z:
        for key in ("layers.3.attention.wk.weight", "layers.3.attention.wk.bias"):
            index = list(loaded).index(key)
            z.read(f"checkpoint/data/{index}")  # raises BadZipFile on a stale CRC-32


def test_writing_the_checkpoint_takes_a_fraction_of_the_models_fp32_size(gguf_metadata, tmp_path):
    """Qwen2.5-Coder-0.5B is 2.5 GB in fp32 (630M weights with its output projection); the stream
    holds a 32 MB chunk of rows and its dequantization's temporaries, not the model (the old
    in-RAM dict, then torch.save, took more than the whole model)."""
    spec, _path, reader, md = gguf_metadata("qwen2.5-coder-0.5b")
    fp32_mb = 4 * sum(int(t.n_elements) for t in reader.tensors) / 2**20
    with _AnonPeak() as peak:
        t0 = time.monotonic()
        ckpt, _, _ = write_checkpoint(reader, md, spec, tmp_path)
        seconds = time.monotonic() - t0
    assert ckpt.stat().st_size >= fp32_mb * 2**20
    assert peak.growth_mb < fp32_mb / 8, (peak.growth_mb, fp32_mb)
    assert seconds < 120, seconds


def test_the_calibration_model_assigns_the_mapped_weights(gguf_metadata, tmp_path):
    """The key smoothing's calibration pass runs the fp32 model over the state dict's own tensors
    (meta construction, ``assign=True``), not a copy of it: its anonymous memory is activations."""
    pytest.importorskip("executorch")
    from app.models import kv_smoothing
    from app.models.checkpoint import stream

    spec, _path, reader, md = gguf_metadata("qwen2.5-coder-0.5b")
    streamed = stream(reader, spec, tmp_path / "checkpoint.pth")
    try:
        sd = streamed.state_dict
        params = make_params(md, spec, has_qkv_bias=True)
        fp32_mb = sum(t.numel() for t in sd.values()) * 4 / 2**20
        with _AnonPeak() as peak:
            kmax, qmax = kv_smoothing.calibration_maxima(sd, params, list(range(1000, 1256)))
        assert kmax.shape == (params["n_layers"], params["n_kv_heads"], params["head_dim"])
        assert torch.isfinite(kmax).all() and torch.isfinite(qmax).all()
        assert peak.growth_mb < fp32_mb / 3, (peak.growth_mb, fp32_mb)
    finally:
        streamed.finish()
