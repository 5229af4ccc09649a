"""The one served model: its runtime, engine, tokenizer and chat template, loaded from a model directory."""

from __future__ import annotations

import errno
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from app.engine import Engine, NativeModel, faults, set_num_threads
from app.engine.native import library
from app.engine.scheduler import StepPolicy
from app.engine.sessions import model_identity
from app.grammar import GrammarCompiler
from app.models.manifest import MANIFEST, check_model_dir, check_program
from app.models.registry import default_model_dir, model_dir, resolve_options
from app.settings import Settings
from app.text.chat_template import ChatTemplate
from app.text.chatml import CHATML_TEMPLATE, IM_END
from app.text.fim import FimTokens
from app.text.reasoning import OPEN_TAG, template_reasons
from app.text.tokenizer import Tokenizer

log = logging.getLogger("etserve")


@dataclass
class ServedModel:
    id: str
    directory: Path
    engine: Engine
    tokenizer: Tokenizer
    template: ChatTemplate | None
    stop_token_ids: frozenset[int]
    grammars: GrammarCompiler  # constrained decoding over this model's tokenizer
    max_tokens_cap: int = 0  # most tokens one choice may generate (0: the context is the limit)
    strict_model_name: bool = False  # a request naming another model gets a 404 (else it is served)
    no_think: bool = False  # templates render with enable_thinking=False unless a request says otherwise
    reasoning: bool = False  # split <think>…</think> out of chat output (the template or vocabulary knows it)
    fim: FimTokens | None = None  # fill-in-the-middle tokens, if the vocabulary has them

    @property
    def context_length(self) -> int:
        return self.engine.context_length

    @property
    def vocab_size(self) -> int:
        """Token ids the model's output covers (its logits), which may differ from the tokenizer's."""
        return self.engine.vocab_size

    @property
    def vocab_limit(self) -> int:
        """Token ids a client may send: inside both the tokenizer's and the model's vocabulary."""
        limit = self.tokenizer.vocab_size
        return min(limit, self.vocab_size) if self.vocab_size > 0 else limit


def resolve_model_dir(settings: Settings) -> tuple[Path, Path]:
    """(directory with tokenizer files, .pte path) for the configured model."""
    if settings.model_path:
        if settings.quantize:
            log.warning("--quantize %s is ignored: --model-path names a built model", settings.quantize)
        path = Path(settings.model_path).expanduser()
        if path.is_dir():
            return path, path / "model.pte"
        return path.parent, path
    directory = _named_model_dir(settings)
    return directory, directory / "model.pte"


def _named_model_dir(settings: Settings) -> Path:
    """The build of --model that --quantize picks (the model's default build without it)."""
    if not settings.quantize:
        return default_model_dir(settings.model)
    return model_dir(settings.model, resolve_options(settings.model, quantize=settings.quantize))


def resolve_tokenizer_files(settings: Settings, directory: Path) -> tuple[Path, Path | None]:
    """(tokenizer.json, tokenizer_config.json or None) from --tokenizer-path / --hf-tokenizer,
    else the files in the model directory."""
    hf = Path(settings.hf_tokenizer).expanduser() if settings.hf_tokenizer else None
    if hf is not None:
        if not hf.is_dir():
            raise FileNotFoundError(f"--hf-tokenizer {hf} is not a directory (it must hold tokenizer_config.json)")
        if not (hf / "tokenizer_config.json").is_file():
            raise FileNotFoundError(f"--hf-tokenizer {hf} has no tokenizer_config.json")
    if settings.tokenizer_path:
        path = Path(settings.tokenizer_path).expanduser()
        tokenizer_json = path / "tokenizer.json" if path.is_dir() else path
        if not tokenizer_json.is_file():
            raise FileNotFoundError(f"--tokenizer-path: no tokenizer.json at {tokenizer_json}")
    elif hf is not None:
        tokenizer_json = hf / "tokenizer.json"
        if not tokenizer_json.is_file():
            raise FileNotFoundError(f"--hf-tokenizer {hf} has no tokenizer.json (or name one with --tokenizer-path)")
    else:
        tokenizer_json = directory / "tokenizer.json"
    config = hf / "tokenizer_config.json" if hf is not None else tokenizer_json.parent / "tokenizer_config.json"
    return tokenizer_json, config if config.is_file() else None


def _context_length(settings: Settings, max_seq_len: int) -> int:
    if settings.max_context > max_seq_len:
        raise ValueError(f"--max-context {settings.max_context} is larger than the model's context: "
                         f"the .pte was exported with max_seq_len {max_seq_len}")
    return settings.max_context or max_seq_len


def load_served_model(settings: Settings) -> ServedModel:
    directory, pte = resolve_model_dir(settings)
    if not pte.exists():
        if settings.model_path:
            raise FileNotFoundError(f"no model at {pte} (--model-path {settings.model_path}): a directory "
                                    "`python -m app.models build` or `build-gguf` printed, or a .pte file")
        raise FileNotFoundError(
            f"no model at {pte}; build it with `python -m app.models build {settings.model}"
            f"{' --quantize ' + settings.quantize if settings.quantize else ''}` or set --model-path"
        )
    manifest = _checked_manifest(directory)
    tokenizer_json, tokenizer_config = resolve_tokenizer_files(settings, directory)
    set_num_threads(settings.threads)
    native = faults.from_env(NativeModel(pte))  # unchanged unless a test sets ETSERVE_FAULT_INJECT
    try:  # a model that fails past this point frees its runtime (the router may try it again)
        if manifest is not None and pte.name in manifest["files"]:
            check_program(manifest, pte, native.info.max_seq_len, native.info.vocab_size)
        _log_refused_huge_pages(native)
        served = serve_model(settings, native, directory, tokenizer_json, tokenizer_config, manifest, pte)
    except BaseException:
        native.close()
        raise
    log.info("loaded %s from %s: context %d, vocab %d, stop ids %s", served.id, pte,
             served.context_length, served.vocab_size, sorted(served.stop_token_ids))
    return served


def _log_refused_huge_pages(native: NativeModel) -> None:
    """Say so when the kernel would not move the loaded weights into huge pages (runtime.cpp
    collapse_loaded): each decode step then takes a TLB miss every 4 KB of them."""
    info = native.memory()
    if info.collapse_refused:
        log.info("the kernel moved %d MB of the loaded weights into huge pages and refused the rest (%s); "
                 "khugepaged may move them later", info.loaded_huge >> 20,
                 errno.errorcode.get(info.collapse_refused, str(info.collapse_refused)))


def serve_model(settings: Settings, native: NativeModel, directory: Path, tokenizer_json: Path,
                tokenizer_config: Path | None, manifest: dict | None = None, pte: Path | None = None) -> ServedModel:
    """The served model around a loaded runtime (a NativeModel, or a stand-in with its interface,
    as tests/fakes gives): its engine, tokenizer, template, stop tokens and grammars."""
    context_length = _context_length(settings, native.info.max_seq_len)
    tokenizer = Tokenizer.from_files(tokenizer_json, tokenizer_config)
    template_source = tokenizer.chat_template
    if template_source is None and settings.allow_chatml_fallback:
        template_source = CHATML_TEMPLATE
        log.warning("the tokenizer has no chat template: chats are rendered as plain ChatML (--allow-chatml-fallback)")
    template = ChatTemplate(template_source, tokenizer.bos_token, tokenizer.eos_token) \
        if template_source else None
    model_id = settings.model_id or _model_name(directory, manifest, settings)
    # a state saved on disk is only restored into the same .pte run by the same native library
    identity = model_identity(pte, library()._name) if settings.session_dir and pte is not None else ""
    engine = Engine(native, prefill_chunk=settings.prefill_chunk, max_queue=settings.max_queue,
                    queue_timeout=settings.queue_timeout, session_cache_mib=settings.session_cache_mib,
                    session_dir=settings.session_dir or None, session_dir_mib=settings.session_dir_mib,
                    model_identity=identity, context_shift=settings.context_shift, keep=settings.keep,
                    slots=settings.parallel, policy=StepPolicy(max_wait=settings.sched_max_wait),
                    prefill_step_s=settings.prefill_step_ms / 1000, draft_max=settings.draft_max,
                    kv_cache_mib=settings.kv_cache_mib)
    engine.context_length = context_length  # --max-context: every length check and /v1/models use it
    if engine.sessions.disk is not None:
        engine.sessions.disk.write_delay = faults.session_write_delay()  # 0 unless a test asks
    stop_ids = frozenset(native.info.eos_ids) | tokenizer.eos_token_ids
    if template_source is CHATML_TEMPLATE and (im_end := tokenizer.token_to_id(IM_END)) is not None:
        stop_ids |= {im_end}  # the fallback's turns end there, whatever the config calls EOS
    grammars = GrammarCompiler.from_file(tokenizer_json,
                                         max(native.info.vocab_size, tokenizer.vocab_size), stop_ids)
    return ServedModel(model_id, directory, engine, tokenizer, template, stop_ids, grammars,
                       max_tokens_cap=settings.max_tokens_cap, no_think=settings.no_think,
                       strict_model_name=settings.strict_model_name,
                       reasoning=template_reasons(template_source, tokenizer.token_to_id(OPEN_TAG) is not None),
                       fim=FimTokens.of(tokenizer))


def _checked_manifest(directory: Path) -> dict | None:
    """The directory's manifest once its files match it (ManifestError names the first that does
    not, before anything is loaded); None for a directory etserve did not build."""
    started = time.monotonic()
    manifest = check_model_dir(directory)
    if manifest is None:
        log.info("%s has no %s: its files are served unchecked", directory, MANIFEST)
    else:
        log.info("%s matches its %s (%d files, %s in %.1f s)", directory, MANIFEST, len(manifest["files"]),
                 "sizes and SHA-256" if manifest.get("sha256") else "sizes only: it records no checksums",
                 time.monotonic() - started)
    return manifest


def _model_name(directory: Path, manifest: dict | None, settings: Settings) -> str:
    if manifest is not None and isinstance(manifest.get("name"), str):
        return manifest["name"]
    return settings.model if not settings.model_path else directory.name
