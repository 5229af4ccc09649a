"""What a constrained generation may produce, written as a Lark grammar.

JSON that validates against a schema (response_format), and the way alternatives are
combined; a tool-call format's own rules live with the format (app.tools.formats.hermes).
"""

from __future__ import annotations

import json
from typing import Any

from .compiler import GrammarError

# JSON as models write it (and Python's json.dumps): ", " and ": ", no free whitespace,
# which small models would otherwise fill with newlines until max_tokens.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


# Keywords whose values are schemas of other values (an item, a property's value): closing an
# object there means what it says.
_OTHERS_ONE = ("items", "additionalItems", "contains")
_OTHERS_LIST = ("prefixItems",)
_OTHERS_MAP = ("properties",)
# Keywords whose schemas apply to the same value as their parent: parts of one object's shape.
_SAME_ONE = ("then", "else")
_SAME_LIST = ("anyOf", "oneOf")
_SAME_MAP = ("dependentSchemas",)
_DEFS = ("$defs", "definitions")
_OPENED_BY = ("additionalProperties", "patternProperties", "unevaluatedProperties")
_MAX_DEPTH = 64


def _is_mixin_parent(schema: dict[str, Any]) -> bool:
    """A schema whose same-value parts (anyOf branches, then/else, a $ref) add to its own shape."""
    return "properties" in schema or "required" in schema


def _mixin_refs(schema: Any, found: set[str], depth: int = 0, mixin: bool = False) -> set[str]:
    """The `$ref`s whose targets are parts of another object's shape (under allOf, beside a
    parent's properties, in then/else): those targets must stay open. Walks what `_close` walks
    (`_children`), and allOf, not and if, which `_close` leaves as they are."""
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return found
    ref = schema.get("$ref")
    if isinstance(ref, str) and (mixin or _is_mixin_parent(schema)):
        found.add(ref)
    subs = [(sub, bool(part)) for _, _, sub, part in _children(schema)]
    subs += [(schema.get(k), False) for k in ("not", "if")]
    subs += [(sub, True) for sub in (schema.get("allOf") if isinstance(schema.get("allOf"), list) else ())]
    for sub, part in subs:
        _mixin_refs(sub, found, depth + 1, mixin=part)
    return found


def closed_objects(schema: Any) -> Any:
    """`schema` with every object that lists its `properties` and says nothing of others closed
    to them (`additionalProperties: false`), as llama.cpp's grammar converter and OpenAI's strict
    mode do: constrained output never invents a key (a 0.5B model, free to, wrote
    `{"city": "Paris", "required": ["city"]}` as a call's arguments, which `fn(**args)` refuses).

    Left open, so that no valid schema becomes unsatisfiable: an object that is only a part of
    another's shape (under `allOf`, an `anyOf`/`oneOf` branch or `then`/`else` of an object that
    lists properties itself, a `$defs` target used so, one with a `$ref` or same-value parts
    beside its properties); one requiring a key it does not list; one with a `const` or `enum`;
    anything under `not` or `if`; anything that opens itself."""
    return _close(schema, _mixin_refs(schema, set()), 0, False)


def _children(schema: dict[str, Any]):
    """(keyword, key or index or None, subschema, whether it is only part of `schema`'s shape) of
    every subschema `_close` goes into (never allOf, not, if)."""
    parent = _is_mixin_parent(schema)
    groups = [(_OTHERS_ONE + ("additionalProperties",), False), (_OTHERS_LIST + _OTHERS_MAP, False),
              (_SAME_ONE, True), (_SAME_LIST, parent), (_SAME_MAP, True)]
    for keys, part in groups:
        for k in keys:
            value = schema.get(k)
            if isinstance(value, list):
                yield from ((k, i, x, part) for i, x in enumerate(value))
            elif isinstance(value, dict) and k in _OTHERS_MAP + _SAME_MAP:
                yield from ((k, n, x, part) for n, x in value.items())
            elif isinstance(value, dict):
                yield k, None, value, part
    for k in _DEFS:  # a target used as part of another object's shape stays open (_mixin_refs)
        if isinstance(schema.get(k), dict):
            yield from ((k, n, x, None) for n, x in schema[k].items())


def _close(schema: Any, open_refs: set[str], depth: int, part: bool) -> Any:
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return schema
    out = dict(schema)
    for k in {k for k, _, _, _ in _children(schema)}:
        out[k] = list(out[k]) if isinstance(out[k], list) else dict(out[k])
    for k, at, sub, sub_part in _children(schema):
        if sub_part is None:
            sub_part = f"#/{k}/{at}" in open_refs
        closed = _close(sub, open_refs, depth + 1, sub_part)
        if at is None:
            out[k] = closed
        else:
            out[k][at] = closed
    parent = _is_mixin_parent(schema)
    props = out.get("properties")
    required = out.get("required") if isinstance(out.get("required"), list) else []
    if (isinstance(props, dict) and not part and all(r in props for r in required)
            and not any(k in out for k in _OPENED_BY + ("allOf", "$ref", "const", "enum") + _SAME_ONE + _SAME_MAP)
            and not (any(k in out for k in _SAME_LIST) and parent and _branches_add(out))):
        out["additionalProperties"] = False
    return out


def _branches_add(schema: dict[str, Any]) -> bool:
    """Whether an anyOf/oneOf branch of `schema` lists or requires keys of its own (then the
    parent closed would refuse them)."""
    return any(isinstance(b, dict) and (_is_mixin_parent(b) or "$ref" in b)
               for k in _SAME_LIST for b in (schema.get(k) if isinstance(schema.get(k), list) else ()))


def json_rule(schema: dict[str, Any]) -> str:
    """A %json rule for `schema`, written in JSON_STYLE unless its own `x-guidance` (llguidance's
    options) says otherwise. GrammarError for an `x-guidance` that is no object."""
    own = schema.get("x-guidance")
    if own is not None and not isinstance(own, dict):
        raise GrammarError("'x-guidance' must be an object of llguidance's JSON options")
    styled = closed_objects(schema)
    styled["x-guidance"] = {**JSON_STYLE, **(own or {})}
    return "%json " + json.dumps(styled, ensure_ascii=False)


def json_grammar(schema: dict[str, Any] | None) -> dict[str, str]:
    """Rules for one JSON value: any object (`schema` None, OpenAI's json_object) or one
    validating against `schema`."""
    return {"answer": json_rule(schema if schema is not None else {"type": "object"})}


def output_grammar(*alternatives: dict[str, str]) -> str:
    """A Lark grammar whose output is any one of `alternatives` (each from the builders above)."""
    rules: dict[str, str] = {}
    starts = []
    for alt in alternatives:
        starts.append(next(iter(alt)))
        rules.update(alt)
    return "\n".join([f"start: {' | '.join(starts)}"] + [f"{k}: {v}" for k, v in rules.items()]) + "\n"
