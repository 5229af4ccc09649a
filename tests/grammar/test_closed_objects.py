"""closed_objects: which object schemas constrained decoding closes to undeclared keys."""

from __future__ import annotations

from app.grammar.formats import closed_objects


def test_objects_listing_properties_are_closed_at_every_depth():
    schema = {"type": "object", "properties": {
        "a": {"type": "object", "properties": {"b": {"type": "string"}}},
        "items": {"type": "array", "items": {"properties": {"x": {}}}},  # a property named like a keyword
        "either": {"anyOf": [{"properties": {"y": {}}}, {"type": "string"}]}},
        "$defs": {"D": {"properties": {"z": {}}}}}
    out = closed_objects(schema)
    assert out["additionalProperties"] is False
    assert out["properties"]["a"]["additionalProperties"] is False
    assert out["properties"]["items"]["items"]["additionalProperties"] is False
    assert out["properties"]["either"]["anyOf"][0]["additionalProperties"] is False
    assert "additionalProperties" not in out["properties"]["either"]["anyOf"][1]
    assert out["$defs"]["D"]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the client's schema is not changed


def test_what_says_otherwise_or_intersects_stays_open():
    for schema in ({"type": "object"},  # json_object: any keys
                   {"properties": {"a": {}}, "additionalProperties": True},
                   {"properties": {"a": {}}, "additionalProperties": {"type": "integer"}},
                   {"properties": {"a": {}}, "patternProperties": {"^x": {}}},
                   {"properties": {"a": {}}, "allOf": [{"properties": {"b": {}}}]},
                   {"properties": {"a": {}}, "$ref": "#/$defs/B"}):
        out = closed_objects(schema)
        assert out.get("additionalProperties", "absent") == schema.get("additionalProperties", "absent")
    parts = closed_objects({"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]})["allOf"]
    assert all("additionalProperties" not in p for p in parts)
    extra = closed_objects({"properties": {}, "additionalProperties": {"properties": {"c": {}}}})
    assert extra["additionalProperties"]["additionalProperties"] is False
