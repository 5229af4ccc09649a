"""Fill-in-the-middle prompts, written with the model's own FIM tokens.

A code model trained for FIM (Qwen2.5-Coder, StarCoder2, ...) reads

    [<|repo_name|>repo\\n <|file_sep|>path\\ntext ... <|file_sep|>current\\n]
    <|fim_prefix|>PREFIX<|fim_suffix|>SUFFIX<|fim_middle|>[already typed]

and writes the middle, then ends its turn (or starts another file with <|file_sep|>).
The repository part (other files as context) is used only when the vocabulary has the
repo and file-separator tokens, as llama.cpp's /infill does; otherwise extra files are
written as plain text before the prefix. Each part is tokenized on its own and the
FIM tokens are put between by id, so text that merely looks like a FIM token stays text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from .tokenizer import Tokenizer

# Token spellings of the families that share this layout: Qwen2.5-Coder's, then StarCoder's.
_NAMES = {
    "prefix": ("<|fim_prefix|>", "<fim_prefix>"),
    "suffix": ("<|fim_suffix|>", "<fim_suffix>"),
    "middle": ("<|fim_middle|>", "<fim_middle>"),
    "pad": ("<|fim_pad|>", "<fim_pad>"),
    "repo": ("<|repo_name|>", "<reponame>"),
    "file_sep": ("<|file_sep|>", "<file_sep>"),
}
REPO_NAME = "myproject"  # the repository line's name when the client gives none (as llama.cpp)


@dataclass(frozen=True)
class ExtraFile:
    filename: str
    text: str


@dataclass(frozen=True)
class FimTokens:
    prefix: int
    suffix: int
    middle: int
    pad: Optional[int] = None
    repo: Optional[int] = None
    file_sep: Optional[int] = None

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> Optional["FimTokens"]:
        """The model's FIM token ids, or None when it has no prefix/suffix/middle tokens."""
        found = {}
        for role, spellings in _NAMES.items():
            found[role] = next((i for s in spellings if (i := tokenizer.token_to_id(s)) is not None), None)
        if None in (found["prefix"], found["suffix"], found["middle"]):
            return None
        return cls(**found)

    @property
    def end_ids(self) -> frozenset[int]:
        """Tokens after which the middle is over: the model moved on to another file or part."""
        return frozenset(i for i in (self.pad, self.repo, self.file_sep, self.prefix, self.suffix, self.middle)
                         if i is not None)

    def prompt(self, tokenizer: Tokenizer, prefix: Sequence[int] | str, suffix: str = "", *,
               extra: Sequence[ExtraFile] = (), typed: str = "") -> list[int]:
        """The token ids of a FIM prompt; `prefix` may already be token ids. `typed` is text
        the user already wrote of the middle (llama.cpp's `prompt` field), after the middle token."""
        def enc(text: str) -> list[int]:
            return tokenizer.encode_text(text) if text else []

        ids: list[int] = []
        if extra and self.repo is not None and self.file_sep is not None:
            ids += [self.repo] + enc(REPO_NAME + "\n")
            for f in extra:
                ids += [self.file_sep] + enc(f"{f.filename}\n{f.text}")
            ids += [self.file_sep] + enc("filename\n")
        else:
            for f in extra:
                ids += enc(f.text)
        ids.append(self.prefix)
        ids += enc(prefix) if isinstance(prefix, str) else list(prefix)
        ids.append(self.suffix)
        ids += enc(suffix)
        ids.append(self.middle)
        ids += enc(typed)
        return ids

