"""Each tool-call format's markup is spelled once, in its module under app/tools/formats/, and the
FIM tokens in app/text/fim.py; other modules import them. Docstrings and comments may name the
markup; code may not spell it."""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"
FORMATS = APP / "tools" / "formats"
MARKUP = ("<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>")


def _code_strings(tree: ast.AST):
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node


def test_markup_is_spelled_only_in_its_format_module():
    where: dict[str, set[str]] = {}
    for path in APP.rglob("*.py"):
        for node in _code_strings(ast.parse(path.read_text(), str(path))):
            for token in MARKUP:
                if token in node.value:
                    where.setdefault(token, set()).add(str(path.relative_to(APP)))
    for token, paths in where.items():
        assert len(paths) == 1 and all(p.startswith("tools/formats/") for p in paths), (token, sorted(paths))


FIM_MARKUP = ("<|fim_", "<fim_", "<|file_sep|>", "<file_sep>", "<|repo_name|>", "<reponame>")


def test_fim_tokens_are_spelled_only_in_the_fim_module():
    where: dict[str, set[str]] = {}
    for path in APP.rglob("*.py"):
        for node in _code_strings(ast.parse(path.read_text(), str(path))):
            for token in FIM_MARKUP:
                if token in node.value:
                    where.setdefault(token, set()).add(str(path.relative_to(APP)))
    for token, paths in where.items():
        assert paths == {"text/fim.py"}, (token, sorted(paths))
