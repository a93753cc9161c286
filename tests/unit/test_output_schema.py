"""Reading structured extraction's `output_schema` (sie.catalog.output_schema): the fields a GLiNER2 model is asked
for, in the schema's order, and what cannot be read named."""

from __future__ import annotations

import pytest

from sie.catalog.output_schema import StructureField, structure_fields


def test_properties_become_fields_in_order() -> None:
    schema = {
        "type": "object",
        "title": "a company",
        "properties": {
            "name": {"type": "string", "description": "its name :: as written"},
            "places": {"type": "array", "items": {"type": "string"}, "title": "where it is"},
            "tone": {"type": "string", "enum": [" positive", "very neutral "]},
        },
        "required": ["name"],
        "additionalProperties": False,
    }
    assert structure_fields(schema, 128) == (
        StructureField("name", is_list=False, choices=None, description="its name : as written"),
        StructureField("places", is_list=True, choices=None, description="where it is"),
        StructureField("tone", is_list=False, choices=("positive", "very neutral"), description=None),
    )


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (None, "must be a JSON Schema of type 'object'"),
        ({"type": "object", "properties": {"x": {"type": "string"}}, "oneOf": []}, "does not read: \\['oneOf'\\]"),
        ({"type": "object", "properties": {"x": {"type": "string", "format": "date"}}}, "read: \\[.format"),
        ({"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x", "x"]}, "distinct"),
        ({"type": "object", "properties": {"x": {"type": "string"}}, "additionalProperties": {}}, "true or false"),
        ({"type": "object", "properties": {" ": {"type": "string"}}}, "property name ' '"),
        ({"type": "object", "properties": {"x" * 129: {"type": "string"}}}, "at most 128 characters"),
        ({"type": "object", "properties": {"x": {"type": "array", "items": {"type": "integer"}}}}, "array of strings"),
        ({"type": "object", "properties": {"x": {"type": "string", "enum": []}}}, "non-empty list"),
        ({"type": "object", "properties": {"x": {"type": "string", "description": 3}}}, "description must be"),
    ],
)
def test_what_cannot_be_read_is_named(schema: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        structure_fields(schema, 128)
