"""Hugging Face style chat templates rendered in a Jinja2 sandbox."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, NoReturn

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError


class TemplateError(Exception):
    """A chat template failed; the message is safe to show to API users."""


def _raise_exception(message: str) -> NoReturn:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _GenerationTag(Extension):
    """Accepts HF's ``{% generation %}...{% endgeneration %}`` and renders the body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Any) -> str:
        return caller()


class _StrictSandbox(ImmutableSandboxedEnvironment):
    """Sandbox where touching an unsafe attribute fails at once instead of yielding ''."""

    def unsafe_undefined(self, obj: Any, attribute: str) -> NoReturn:
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")


def _environment() -> jinja2.Environment:
    env = _StrictSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template; render it for many conversations."""

    def __init__(self, source: str, bos_token: str | None = None, eos_token: str | None = None) -> None:
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as e:
            raise TemplateError(f"chat template error: {e}") from e
        self._tokens = {k: v for k, v in (("bos_token", bos_token), ("eos_token", eos_token)) if v is not None}

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """Render the prompt text (special tokens appear as text)."""
        context = {
            **self._tokens,
            "messages": messages,
            "tools": tools,
            "add_generation_prompt": add_generation_prompt,
            **template_kwargs,
        }
        try:
            return self._template.render(**context)
        except TemplateError:
            raise
        except Exception as e:  # jinja errors, and Python errors such as str + None
            raise TemplateError(f"chat template error: {e}") from e
