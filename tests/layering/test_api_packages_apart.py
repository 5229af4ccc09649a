"""The API packages (app/openai, app/anthropic, app/llamacpp) never import each other: what they
share is the HTTP core (app/http). Fast: parses the files, imports nothing."""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"
APIS = ("openai", "anthropic", "llamacpp")


def _package(path: Path) -> list[str]:
    """The dotted package a module file belongs to, as a list: app/openai/chat/x.py -> app.openai.chat."""
    parts = ["app", *path.relative_to(APP).with_suffix("").parts]
    return parts if parts[-1] == "__init__" and parts.pop() else parts[:-1]


def imported(path: Path, tree: ast.AST) -> list[tuple[int, str]]:
    """Every module `tree` imports, absolute (relative imports resolved against `path`), with its line;
    `from X import name` also counts X.name, which may be a module."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = _package(path)
                base = package[:len(package) - node.level + 1] if node.level > 1 else package
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.append((node.lineno, module))
            out += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return out


def sibling_imports(api: str) -> list[str]:
    found = []
    for path in sorted((APP / api).rglob("*.py")):
        for line, module in imported(path, ast.parse(path.read_text(), str(path))):
            parts = module.split(".")
            if len(parts) >= 2 and parts[0] == "app" and parts[1] in APIS and parts[1] != api:
                found.append(f"{path.relative_to(APP.parent)}:{line}: {module}")
    return found


def test_the_api_packages_import_only_the_core_not_each_other():
    found = [hit for api in APIS for hit in sibling_imports(api)]
    assert not found, "an API package imports another (share it through app/http instead):\n" + "\n".join(found)


def test_every_spelling_of_an_import_is_read():
    """Relative imports resolve against their package: `from ..openai.errors import x` in
    app/anthropic/x.py is app.openai.errors."""
    path = APP / "anthropic" / "serving.py"
    modules = [m for _, m in imported(path, ast.parse("from ..openai.errors import APIError\nfrom .shapes import x\n"))]
    assert "app.openai.errors" in modules and "app.anthropic.shapes" in modules and "app.shapes" not in modules
    for source in ("from .. import openai\n", "from app import openai\n", "import app.openai.sse\n"):
        assert any(m.startswith("app.openai") for _, m in imported(path, ast.parse(source))), source
    deep = APP / "llamacpp" / "completion" / "serving.py"
    assert "app.openai.chat" in [m for _, m in imported(deep, ast.parse("from ...openai import chat\n"))]
