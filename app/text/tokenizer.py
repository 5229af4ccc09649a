"""Tokenizer: a model directory's ``tokenizer.json`` + ``tokenizer_config.json``."""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as _HFTokenizer

# transformers writes ~1e30 for "no limit"; treat anything this large as unset.
_UNSET_MAX_LENGTH = 10**18


@lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """GPT-2 byte-level table, reversed: printable unicode char -> byte."""
    bs = list(range(ord("!"), ord("~") + 1))
    bs += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _is_byte_level(decoder: dict[str, Any] | None) -> bool:
    if not decoder:
        return False
    if decoder.get("type") == "ByteLevel":
        return True
    return any(_is_byte_level(d) for d in decoder.get("decoders", []))


def _is_byte_fallback(decoder: dict[str, Any] | None) -> bool:
    """SentencePiece BPE with byte fallback (Gemma): "▁" is a space, ``<0xNN>`` pieces are bytes."""
    if not decoder:
        return False
    if decoder.get("type") == "ByteFallback":
        return True
    return any(_is_byte_fallback(d) for d in decoder.get("decoders", []))


_SPM_SPACE = "\u2581"


def _spm_piece_bytes(piece: str) -> bytes:
    """One SentencePiece vocab piece as the decoder emits it (no leading-space strip: the
    byte-fallback tokenizers we build add no space prefix)."""
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return bytes([int(piece[3:5], 16)])
        except ValueError:
            pass
    return piece.replace(_SPM_SPACE, " ").encode("utf-8")


def _piece_bytes(piece: str, table: dict[str, int]) -> bytes:
    """Reverse byte-level BPE for one vocab piece (as the HF ByteLevel decoder does)."""
    try:
        return bytes(table[c] for c in piece)
    except KeyError:  # not a byte-level piece: the decoder keeps it verbatim
        return piece.encode("utf-8")


class Tokenizer:
    """Byte-level BPE (or SentencePiece byte-fallback BPE) tokenizer with the metadata the server needs."""

    def __init__(self, tokenizer_json: str, config: dict[str, Any] | None = None) -> None:
        config = config or {}
        spec = json.loads(tokenizer_json)
        byte_level = _is_byte_level(spec.get("decoder"))
        if not byte_level and not _is_byte_fallback(spec.get("decoder")):
            raise ValueError("unsupported tokenizer: only byte-level BPE and byte-fallback (SentencePiece) "
                             "decoders are supported")
        self._tok = _HFTokenizer.from_str(tokenizer_json)
        # Text read as text (special tokens split as characters): an instance of its own, so no
        # flag is flipped on the shared one while another thread encodes with it.
        self._tok_text = _HFTokenizer.from_str(tokenizer_json)
        self._tok_text.encode_special_tokens = True

        self.chat_template: str | None = config.get("chat_template") or None
        self.bos_token: str | None = _token_content(config.get("bos_token"))
        self.eos_token: str | None = _token_content(config.get("eos_token"))
        self.pad_token: str | None = _token_content(config.get("pad_token"))
        self.add_bos_token: bool = bool(config.get("add_bos_token", False))
        mml = config.get("model_max_length")
        self.model_max_length: int | None = (
            int(mml) if isinstance(mml, (int, float)) and 0 < mml < _UNSET_MAX_LENGTH else None
        )

        vocab: dict[str, int] = self._tok.get_vocab(with_added_tokens=True)
        self.vocab_size: int = max(vocab.values()) + 1 if vocab else 0

        special: dict[int, bool] = {a["id"]: bool(a.get("special")) for a in spec.get("added_tokens", [])}
        added_content: dict[int, str] = {a["id"]: a["content"] for a in spec.get("added_tokens", [])}
        for key, tok in (config.get("added_tokens_decoder") or {}).items():
            special[int(key)] = bool(tok.get("special", special.get(int(key), False)))
            added_content.setdefault(int(key), tok["content"])
        self._special: frozenset[int] = frozenset(i for i, s in special.items() if s)
        # the texts of the control tokens: in client text they are text (app/text/chat_prompt.py)
        self.special_token_texts: list[str] = sorted({added_content[i] for i in self._special
                                                      if added_content.get(i)})

        table = byte_decoder()
        pieces: list[bytes] = [b""] * self.vocab_size
        for piece, i in vocab.items():
            pieces[i] = _piece_bytes(piece, table) if byte_level else _spm_piece_bytes(piece)
        for i, content in added_content.items():
            if 0 <= i < self.vocab_size:
                pieces[i] = content.encode("utf-8")
        self._bytes: tuple[bytes, ...] = tuple(pieces)

        eos_ids = {int(i) for i in config.get("eos_token_ids") or []}
        if self.eos_token is not None and (eos_id := self.token_to_id(self.eos_token)) is not None:
            eos_ids.add(eos_id)
        self.eos_token_ids: frozenset[int] = frozenset(eos_ids)
        self.bos_token_id: int | None = self.token_to_id(self.bos_token) if self.bos_token else None

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Load from a model directory."""
        path = Path(path)
        return cls.from_files(path / "tokenizer.json", path / "tokenizer_config.json")

    @classmethod
    def from_files(cls, tokenizer_json: str | Path, config_path: str | Path | None = None) -> Tokenizer:
        """Load a tokenizer.json, with a tokenizer_config.json if it exists."""
        config_path = Path(config_path) if config_path is not None else None
        config = json.loads(config_path.read_text(encoding="utf-8")) \
            if config_path is not None and config_path.exists() else {}
        return cls(Path(tokenizer_json).read_text(encoding="utf-8"), config)

    def encode(self, text: str, *, add_bos: bool | None = None) -> list[int]:
        """Token ids of ``text``; special tokens written in the text map to their ids.

        BOS is prepended when ``add_bos`` (default: the config's ``add_bos_token``)
        and the text does not already start with it.
        """
        ids: list[int] = _encode(self._tok, text)
        if add_bos is None:
            add_bos = self.add_bos_token
        if add_bos and self.bos_token_id is not None and ids[:1] != [self.bos_token_id]:
            ids.insert(0, self.bos_token_id)
        return ids

    def encode_text(self, text: str) -> list[int]:
        """Token ids of ``text`` read as plain text: a special token written in it (``<|im_end|>``)
        is not parsed into its id. No BOS. For text a user supplies inside a prompt we build."""
        return _encode(self._tok_text, text)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids`` (invalid UTF-8 becomes U+FFFD)."""
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """Raw bytes of one token; unknown ids give ``b""``."""
        if 0 <= token_id < self.vocab_size:
            return self._bytes[token_id]
        return b""

    def is_special(self, token_id: int) -> bool:
        """True for control tokens (added tokens marked special)."""
        return token_id in self._special

    def token_to_id(self, s: str) -> int | None:
        return self._tok.token_to_id(s)

    def id_to_token(self, i: int) -> str | None:
        return self._tok.id_to_token(i)


# Past this many characters a text is encoded through encode_batch, which releases the GIL while
# the Rust tokenizer works (encode keeps it): a multi-megabyte prompt tokenized in a worker thread
# (app/admission.py) then leaves the event loop free to serve others.
_LONG_TEXT = 1 << 16


def _encode(tok: _HFTokenizer, text: str) -> list[int]:
    if len(text) > _LONG_TEXT:
        return tok.encode_batch([text], add_special_tokens=False)[0].ids
    return tok.encode(text, add_special_tokens=False).ids


def _token_content(tok: Any) -> str | None:
    """Config tokens are either a string or an AddedToken dict."""
    if isinstance(tok, dict):
        return tok.get("content")
    return tok if isinstance(tok, str) else None
