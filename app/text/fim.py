"""Fill-in-the-middle prompts, written with the model's own FIM tokens.

A code model trained for FIM (Qwen2.5-Coder, StarCoder2, ...) reads

    [<|repo_name|>repo\\n <|file_sep|>path\\ntext ... <|file_sep|>current\\n]
    <|fim_prefix|>PREFIX<|fim_suffix|>SUFFIX<|fim_middle|>[already typed]

and writes the middle, then ends its turn (or starts another file with <|file_sep|>).
The repository part (other files as context) is used only when the vocabulary has the
repo and file-separator tokens, as llama.cpp's /infill does; otherwise extra files are
written as plain text before the prefix. Each part is tokenized on its own and the
FIM tokens are put between by id, so text that merely looks like a FIM token stays text.

A prompt too long for its token budget is trimmed the way editors expect, never refused
(`FimTokens.fit`): what is nearest the cursor stays. The local context (prefix and suffix)
comes first: the suffix gets at most a quarter of the budget, the prefix the rest it needs;
whole lines are dropped from the prefix's start and the suffix's end. Extra files get what
the local context leaves, the latest ones (the end of the list: llama.vscode's ring buffer
puts its newest chunks last) kept, the oldest dropped whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

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
# The tokens a model needs to infill, as an error names them.
REQUIRED = ", ".join(_NAMES[part][0] for part in ("prefix", "suffix", "middle"))
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


    def fit(self, tokenizer: Tokenizer, prefix: Sequence[int] | str, suffix: str = "", *,
            extra: Sequence[ExtraFile] = (), typed: str = "", budget: int) -> tuple[list[int], bool]:
        """The prompt of `prompt`, trimmed to at most `budget` tokens (see the module docstring);
        with whether anything was dropped."""
        full = self.prompt(tokenizer, prefix, suffix, extra=extra, typed=typed)
        if len(full) <= budget:
            return full, False

        def enc(text: str) -> list[int]:
            return tokenizer.encode_text(text) if text else []

        typed_ids = enc(typed)[-max(0, budget // 8):] if typed else []  # what is typed is kept, within reason
        room = max(0, budget - 3 - len(typed_ids))  # 3: the prefix, suffix and middle tokens
        suffix_ids = _keep_lines(suffix, enc, min(len(enc(suffix)), room // 4), from_end=False)
        if isinstance(prefix, str):
            prefix_ids = _keep_lines(prefix, enc, room - len(suffix_ids), from_end=True)
        else:
            prefix_ids = list(prefix)[len(prefix) - (room - len(suffix_ids)):] if room > len(suffix_ids) else []
        left = room - len(prefix_ids) - len(suffix_ids)
        kept: list[ExtraFile] = []
        if extra:
            # the repository header and the current file's separator cost tokens of their own
            overhead = len(self.prompt(tokenizer, "", "", extra=[ExtraFile("", "")])) - 3
            left -= overhead
            for f in reversed(extra):  # newest first
                cost = len(self.prompt(tokenizer, "", "", extra=[f])) - 3 - overhead
                if cost > left:
                    break
                kept.insert(0, f)
                left -= cost
        ids = self.prompt(tokenizer, prefix_ids, "", extra=kept)[:-1]  # up to the suffix token
        ids += suffix_ids + [self.middle] + typed_ids
        if len(ids) > budget:  # tokenization across the cut differs a little: drop from the far end
            cut = len(ids) - budget
            head = len(ids) - len(prefix_ids) - len(suffix_ids) - 2 - len(typed_ids)
            ids = ids[:head] + ids[head + cut:]
        return ids, True


def _keep_lines(text: str, enc: Callable[[str], list[int]], budget: int, *, from_end: bool) -> list[int]:
    """The tokens of `text`'s lines nearest the cursor (its end when `from_end`, else its start),
    as many whole lines as fit in `budget`; a single line too long is cut by tokens."""
    if budget <= 0 or not text:
        return []
    ids = enc(text)
    if len(ids) <= budget:
        return ids
    lines = text.splitlines(keepends=True)
    order = reversed(lines) if from_end else lines
    kept: list[str] = []
    used = 0
    for line in order:
        cost = len(enc(line))
        if used + cost > budget:
            break
        kept.append(line)
        used += cost
    if not kept:  # the cursor's own line is longer than the budget: keep the tokens next to the cursor
        return ids[-budget:] if from_end else ids[:budget]
    joined = "".join(reversed(kept)) if from_end else "".join(kept)
    ids = enc(joined)
    while len(ids) > budget and len(kept) > 1:  # whole-text tokenization came out longer: one line less
        kept.pop()
        joined = "".join(reversed(kept)) if from_end else "".join(kept)
        ids = enc(joined)
    return ids[-budget:] if from_end else ids[:budget]
