"""The native runtime through ctypes, on the real test model: metadata, bounds, sampling."""

from __future__ import annotations

import errno
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.engine import NativeError, NativeModel, SamplingParams
from app.engine.native import MemoryInfo
from app.models.manifest import read_manifest

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def model(model_dir):
    m = NativeModel(model_dir / "model.pte")
    yield m
    m.close()


@pytest.fixture(scope="module")
def prompt_ids(served_model):
    text = served_model.template.render([{"role": "user", "content": "What is the capital of France?"}])
    return served_model.tokenizer.encode(text)


def argmax(xs) -> int:
    return max(range(len(xs)), key=xs.__getitem__)


def test_metadata(model, served_model):
    info = model.info
    assert info.vocab_size == served_model.tokenizer.vocab_size
    assert info.max_seq_len == 512
    assert info.max_prefill_len > 1 and info.dynamic_shape
    assert 2 in info.eos_ids  # <|im_end|>


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(NativeError, match="cannot"):
        NativeModel(tmp_path / "nope.pte")
    bogus = tmp_path / "bogus.pte"
    bogus.write_bytes(b"not a program at all" * 100)
    with pytest.raises(NativeError):
        NativeModel(bogus)


def test_bounds_are_refused_and_model_keeps_working(model, prompt_ids):
    with pytest.raises(NativeError, match="outside the KV cache"):
        model.forward([1, 2, 3], model.info.max_seq_len - 2)
    with pytest.raises(NativeError, match="outside the KV cache"):
        model.forward([1], -1)
    with pytest.raises(NativeError, match="vocabulary"):
        model.forward([model.info.vocab_size], 0)
    with pytest.raises(NativeError):
        model.forward([1] * (model.info.max_prefill_len + 1), 0)
    model.forward(prompt_ids, 0)
    logits = model.logits()
    assert len(logits) == model.info.vocab_size and all(math.isfinite(x) for x in logits[:1000])


def test_greedy_is_argmax_and_logprob_is_normalized(model, prompt_ids):
    model.forward(prompt_ids, 0)
    logits = model.logits()
    token, logprob, _ = model.sample(GREEDY, 0)
    assert token == argmax(logits)
    m = max(logits)
    lse = m + math.log(sum(math.exp(x - m) for x in logits))
    assert logprob == pytest.approx(logits[token] - lse, abs=1e-4)
    assert logprob <= 0


def test_sampling_controls(model, prompt_ids):
    model.forward(prompt_ids, 0)
    best = argmax(model.logits())
    # top_k=1 (or a tiny top_p) at any temperature is greedy
    for params in (SamplingParams(temperature=1.5, top_k=1), SamplingParams(temperature=1.5, top_p=1e-6)):
        assert {model.sample(params, seed)[0] for seed in range(20)} == {best}
    # a ban removes the greedy token
    banned = SamplingParams(temperature=0.0, logit_bias={best: -100.0})
    assert model.sample(banned, 0)[0] != best
    # the same seed gives the same draws; different seeds differ somewhere
    hot = SamplingParams(temperature=1.5)
    draws = lambda seed: [model.sample(hot, seed + i)[0] for i in range(0, 200, 10)]
    assert draws(7) == draws(7)
    assert len(set(draws(7)) | set(draws(1234))) > 1
    # min_p=1 keeps only the best token
    assert {model.sample(SamplingParams(temperature=2.0, min_p=1.0), s)[0] for s in range(10)} == {best}


def test_chunked_prefill_matches_one_call(model, prompt_ids):
    model.forward(prompt_ids, 0)
    whole = model.logits()
    for chunk in (1, 5, 16):
        for pos in range(0, len(prompt_ids), chunk):
            model.forward(prompt_ids[pos:pos + chunk], pos)
        parts = model.logits()
        assert max(abs(a - b) for a, b in zip(whole, parts)) < 1e-3
        assert argmax(parts) == argmax(whole)


def test_top_logprobs(model, prompt_ids):
    model.forward(prompt_ids, 0)
    greedy, greedy_logprob, _ = model.sample(GREEDY, 0)
    top = model.top_logprobs(5)
    assert len(top) == 5 and len({t for t, _ in top}) == 5
    logprobs = [lp for _, lp in top]
    assert logprobs == sorted(logprobs, reverse=True) and logprobs[0] <= 0
    assert top[0][0] == greedy and top[0][1] == pytest.approx(greedy_logprob, abs=1e-5)
    assert sum(math.exp(lp) for lp in logprobs) <= 1 + 1e-5
    assert model.top_logprobs(0) == []


def test_the_test_model_runs_our_custom_op_kernels(model_dir):
    """The served export uses llama::custom_sdpa / update_cache, so every test above ran our kernels."""
    import mmap

    assert read_manifest(model_dir)["custom_ops"] is True
    with open(model_dir / "model.pte", "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        assert m.find(b"llama::custom_sdpa") != -1 and m.find(b"llama::update_cache") != -1


def test_a_top_k_of_the_vocabulary_or_more_is_off(model, prompt_ids):
    """However large: 2^50 does not fit the C struct's int32 and must not reach it wrapped."""
    model.forward(prompt_ids, 0)
    draws = lambda k: [model.sample(SamplingParams(temperature=1.5, top_k=k), s)[0] for s in range(0, 100, 10)]
    off = draws(0)
    assert draws(model.info.vocab_size) == off
    assert draws(1262796495732399) == off
    assert draws(2**31) == off


def test_a_top_p_below_float32s_range_keeps_the_best_token(model, prompt_ids):
    """1e-300 is a valid top_p (in (0, 1]) that float32 rounds to 0, the C sampler's "off"."""
    model.forward(prompt_ids, 0)
    best = argmax(model.logits())
    assert {model.sample(SamplingParams(temperature=1.5, top_p=1e-300), s)[0] for s in range(20)} == {best}
    # and 0, which OpenAI's API allows (some clients send it for greedy): the best token only
    assert {model.sample(SamplingParams(temperature=1.5, top_p=0.0), s)[0] for s in range(20)} == {best}


def _thp_mode() -> str:
    """The kernel's transparent huge page mode: always, madvise or never ("never" without THP)."""
    path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    found = re.search(r"\[(\w+)\]", path.read_text()) if path.exists() else None
    return found.group(1) if found else "never"


# The model loaded in a fresh process, as a server's worker loads it: in pytest's process, models
# loaded and freed by earlier tests leave malloc serving XNNPACK's weights from blocks it already
# had (CI's full run: 0 bytes moved, nothing refused), which no server sees.
ROOT = Path(__file__).resolve().parents[2]
_LOAD_IN_A_NEW_PROCESS = """
import dataclasses, json, math, sys
from app.engine import NativeModel
m = NativeModel(sys.argv[1])
ids = json.loads(sys.argv[2])
before = m.memory()
m.forward(ids, 0)
after = m.memory()
m.forward(ids, len(ids))
print(json.dumps({"before": dataclasses.asdict(before), "after": dataclasses.asdict(after),
                  "finite": all(math.isfinite(x) for x in m.logits()[:1000])}))
m.close()
"""


def test_the_models_memory_is_in_huge_pages(model_dir, prompt_ids):
    """A decode step reads all the weights and the whole KV cache; in 4 KB pages that is a TLB
    miss every 4 KB, and hardware prefetchers stop at every page's end (runtime.cpp):
    - the forward method's planned buffers (activations and KV caches) are our own mappings,
      advised as transparent huge pages before anything touches them: nothing resident before
      the first forward call, in 2 MB pages after it;
    - what the load allocated on the heap (here XNNPACK's packed copy of the fp32 weights) is
      moved into huge pages at load (MADV_COLLAPSE).
    Where the kernel has THP in madvise or always mode; skipped where it is off."""
    proc = subprocess.run([sys.executable, "-c", _LOAD_IN_A_NEW_PROCESS, str(model_dir / "model.pte"),
                           json.dumps(prompt_ids)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    before, after = MemoryInfo(**out["before"]), MemoryInfo(**out["after"])
    assert before.planned > 2 << 20 and before.planned_huge == 0
    assert after.planned == before.planned
    if _thp_mode() == "never":
        pytest.skip("this kernel has transparent huge pages off")
    assert after.planned_huge >= after.planned // 2, after
    if after.loaded_huge < 64 << 20 and after.collapse_refused in (errno.EAGAIN, errno.ENOMEM, errno.EINVAL):
        # no free 2 MB page left in fragmented memory
        pytest.skip(f"the kernel refused MADV_COLLAPSE ({errno.errorcode[after.collapse_refused]})")
    assert after.loaded_huge >= 64 << 20, after  # of the test model's 540 MB of fp32 weights
    assert out["finite"]  # still a working model over those pages


def test_a_model_that_fails_past_its_runtime_frees_it(model_dir, tmp_path, monkeypatch):
    # the router tries a failed model again on its next request: each try left a runtime behind
    # until the garbage collector found it
    import shutil

    import app.model_host as host
    from app.settings import Settings

    broken = tmp_path / "bad-tokenizer"
    broken.mkdir()
    (broken / "model.pte").symlink_to(model_dir / "model.pte")
    shutil.copy(model_dir / "tokenizer_config.json", broken / "tokenizer_config.json")
    (broken / "tokenizer.json").write_text("{not a tokenizer")
    opened = []

    class Recorded(NativeModel):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            opened.append(self)

    monkeypatch.setattr(host, "NativeModel", Recorded)
    with pytest.raises(Exception):
        host.load_served_model(Settings.from_env({"ETSERVE_MODEL_PATH": str(broken), "ETSERVE_THREADS": "2"}))
    assert len(opened) == 1  # it failed past the runtime's creation
    assert opened[0]._handle is None  # and freed it at once
