"""Structured extraction's `output_schema`: the JSON Schema a GLiNER2 model fills, read into the fields it is asked
for. The subset the public server accepts: an object whose properties are strings, strings of an `enum`, or arrays
of strings, each with an optional `description` (or `title`); `required` and `additionalProperties` may be stated.

A string property is one span of the text (the model's `str` field), an array every span it finds (`list`), an enum
one of its values (chosen, not read from the text). Names, values and descriptions reach the model's prompt, so the
prompt's own delimiters are refused in them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

# What GLiNER2's field specifications use as delimiters (`name::[a|b]::str::description`).
DELIMITERS: Final = ("::", "|", "[", "]")
ROOT_KEYWORDS: Final = frozenset({"type", "properties", "required", "additionalProperties", "description", "title"})
PROPERTY_KEYWORDS: Final = frozenset({"type", "description", "enum", "items", "title"})


@attrs.frozen
class StructureField:
    """One property of the output schema as the model reads it."""

    name: str
    is_list: bool  # an array of strings: every span; else one span (or one enum value)
    choices: tuple[str, ...] | None = None  # an enum's values, in order
    description: str | None = None


def structure_fields(output_schema: Any, max_chars: int) -> tuple[StructureField, ...]:
    """The fields `output_schema` asks for, in its order; ValueError naming the first thing that cannot be read.
    Names and enum values are non-blank strings of at most `max_chars` characters."""
    if not isinstance(output_schema, Mapping) or output_schema.get("type") != "object":
        raise ValueError("Field 'output_schema' must be a JSON Schema of type 'object'")
    unsupported = sorted(set(output_schema) - ROOT_KEYWORDS)
    if unsupported:
        raise ValueError(f"Field 'output_schema' has keywords structured extraction does not read: {unsupported}")
    properties = output_schema.get("properties")
    if not isinstance(properties, Mapping) or not properties:
        raise ValueError("Field 'output_schema' needs a non-empty 'properties' object")
    required = output_schema.get("required", [])
    if (not isinstance(required, list) or len(set(map(str, required))) != len(required)
            or any(not isinstance(name, str) or name not in properties for name in required)):  # fmt: skip
        raise ValueError("Field 'output_schema': 'required' must list distinct property names")
    if not isinstance(output_schema.get("additionalProperties", True), bool):
        raise ValueError("Field 'output_schema': 'additionalProperties' must be true or false")
    return tuple(_field(name, definition, max_chars) for name, definition in properties.items())


def _field(name: Any, definition: Any, max_chars: int) -> StructureField:
    if not _is_value(name, max_chars):
        raise ValueError(f"Field 'output_schema': property name {_shown(name)} must be a non-blank string of at most "
                         f"{max_chars} characters without {' '.join(DELIMITERS)}")  # fmt: skip
    where = f"Field 'output_schema': property {name!r}"
    if not isinstance(definition, Mapping):
        raise ValueError(f"{where} must be an object")
    unsupported = sorted(set(definition) - PROPERTY_KEYWORDS)
    if unsupported:
        raise ValueError(f"{where} has keywords structured extraction does not read: {unsupported}")
    description = definition.get("description") or definition.get("title")
    if description is not None and not isinstance(description, str):
        raise ValueError(f"{where}: its description must be a string")
    description = description.replace("::", ":") if description else None
    kind, enum = definition.get("type"), definition.get("enum")
    if enum is not None:
        if kind != "string" or not isinstance(enum, list) or not enum:
            raise ValueError(f"{where}: an 'enum' must be a non-empty list of strings of type 'string'")
        if not all(_is_value(choice, max_chars) for choice in enum):
            raise ValueError(f"{where}: each enum value must be a non-blank string of at most {max_chars} "
                             f"characters without {' '.join(DELIMITERS)}")  # fmt: skip
        return StructureField(name, False, tuple(choice.strip() for choice in enum), description)
    if kind == "string":
        return StructureField(name, False, None, description)
    if kind == "array" and definition.get("items") == {"type": "string"}:
        return StructureField(name, True, None, description)
    raise ValueError(f"{where} must be a string, a string enum or an array of strings")


def _is_value(value: Any, max_chars: int) -> bool:
    return (isinstance(value, str) and bool(value.strip()) and len(value) <= max_chars
            and not any(delimiter in value for delimiter in DELIMITERS))  # fmt: skip


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
