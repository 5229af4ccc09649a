"""Prompts of a chosen length in tokens: deterministic code-like text, first chat turns, and
filler token ids, measured with the server's own tokenizer and chat template."""

from __future__ import annotations

from pathlib import Path
from typing import Callable


def filler(n: int, vocab: int) -> list[int]:
    """Deterministic ordinary token ids (no specials at the bottom of the vocabulary)."""
    return [1000 + (i * 7919) % (min(vocab, 30000) - 1000) for i in range(n)]


def source_text(seed: str, n: int) -> str:
    """Deterministic code-like text of n functions: a model continues it for as long as asked."""
    return "".join(f"def {seed}_{i}(x, y):\n    \"\"\"Combine x and y, variant {i}.\"\"\"\n"
                   f"    return x * {i % 17 + 2} + y - {i * 3 % 11}\n\n" for i in range(n))


def grow_to(target: int, size_of: Callable[[int], int]) -> int:
    """The smallest number of source_text functions whose rendering is >= target tokens."""
    n = 1
    while True:
        size = size_of(n)
        if size >= target:
            return n
        n += max(1, (target - size) // 40)


def code_prompt(tokenizer, seed: str, target: int) -> str:
    """A raw completion prompt of about `target` tokens. Its first line names the seed, so two
    prompts of different seeds share no prefix a server could reuse."""
    head = f"# module {seed}\n"
    return head + source_text(seed, grow_to(target, lambda n: len(tokenizer.encode(head + source_text(seed, n)))))


def history_messages(tokenizer, template, seed: str, target: int) -> list[dict]:
    """A first user turn whose rendered chat prompt is about `target` tokens."""
    def messages(n: int) -> list[dict]:
        return [{"role": "user", "content": "Review this module:\n\n" + source_text(seed, n)}]

    def size(n: int) -> int:
        return len(tokenizer.encode(template.render(messages(n), add_generation_prompt=True)))

    return messages(grow_to(target, size))


def load_tokenizer(model_dir: Path):
    """The server's own tokenizer and chat template for a model directory."""
    from app.text.chat_template import ChatTemplate
    from app.text.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(model_dir)
    return tokenizer, ChatTemplate(tokenizer.chat_template, tokenizer.bos_token, tokenizer.eos_token)
