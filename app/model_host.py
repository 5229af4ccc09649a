"""The one served model: its runtime, engine, tokenizer and chat template, loaded from a model directory."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from app.engine import Engine, NativeModel, set_num_threads
from app.models.registry import default_model_dir
from app.settings import Settings
from app.text.chat_template import ChatTemplate
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

    @property
    def context_length(self) -> int:
        return self.engine.context_length


def resolve_model_dir(settings: Settings) -> tuple[Path, Path]:
    """(directory with tokenizer files, .pte path) for the configured model."""
    if settings.model_path:
        path = Path(settings.model_path).expanduser()
        if path.is_dir():
            return path, path / "model.pte"
        return path.parent, path
    directory = default_model_dir(settings.model)
    return directory, directory / "model.pte"


def load_served_model(settings: Settings) -> ServedModel:
    directory, pte = resolve_model_dir(settings)
    if not pte.exists():
        raise FileNotFoundError(
            f"no model at {pte}; build it with `python -m app.models build {settings.model}` or set --model-path"
        )
    set_num_threads(settings.threads)
    native = NativeModel(pte)
    tokenizer = Tokenizer.from_dir(directory)
    template = ChatTemplate(tokenizer.chat_template, tokenizer.bos_token, tokenizer.eos_token) \
        if tokenizer.chat_template else None
    model_id = settings.model_id or _model_name(directory, settings)
    engine = Engine(native, prefill_chunk=settings.prefill_chunk, max_queue=settings.max_queue,
                    queue_timeout=settings.queue_timeout)
    stop_ids = frozenset(native.info.eos_ids) | tokenizer.eos_token_ids
    log.info("loaded %s from %s: context %d, vocab %d, stop ids %s", model_id, pte,
             engine.context_length, native.info.vocab_size, sorted(stop_ids))
    return ServedModel(model_id, directory, engine, tokenizer, template, stop_ids)


def _model_name(directory: Path, settings: Settings) -> str:
    meta = directory / "etserve.json"
    if meta.exists():
        try:
            return json.loads(meta.read_text())["name"]
        except (ValueError, KeyError):
            pass
    return settings.model if not settings.model_path else directory.name
