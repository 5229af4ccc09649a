"""Constrained decoding: grammars for JSON and tool calls, compiled over the model's
tokenizer into per-step token masks that the native sampler applies."""

from .compiler import Grammar, GrammarCompiler, GrammarError, TokenMatcher
from .formats import json_grammar, json_rule, output_grammar
from .lazy import DISARM, LazyGrammar, LazyMatcher

__all__ = [
    "DISARM",
    "LazyGrammar",
    "LazyMatcher",
    "Grammar",
    "GrammarCompiler",
    "GrammarError",
    "TokenMatcher",
    "json_grammar",
    "output_grammar",
    "json_rule",
]
