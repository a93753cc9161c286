"""Request bodies into plain documents, before the write lock (seed 000 §3.2): YAML model configs and the
JSON resolve body, with the model-id check. Blocking CPU work: callers run these in a thread.
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping
from typing import Any

import orjson

from sie.catalog import ConfigError, InvalidModelIdError, load_yaml, validate_model_id
from sie.control.errors import InvalidModelSpecError, MissingFieldError, RequestParseError


def parse_yaml_document(body: bytes) -> dict[str, Any]:
    """A YAML mapping from the body; 400 parse_error for bad or refused YAML (alias bombs, deep nesting) or a
    non-mapping, 400 invalid_model_id when a top-level `sie_id` is not a string or breaks the id rules."""
    try:
        data = load_yaml(body.decode("utf-8"), "request")
    except UnicodeDecodeError as exc:
        raise RequestParseError(f"Invalid YAML: body is not UTF-8 ({exc.reason})") from exc
    except ConfigError as exc:
        raise RequestParseError(exc.message) from exc
    if not isinstance(data, Mapping):
        raise RequestParseError("Expected YAML mapping at top level")
    sie_id = data.get("sie_id")
    if sie_id is not None and not isinstance(sie_id, str):
        shown = reprlib.repr(sie_id)
        raise InvalidModelIdError(
            f"Model ID must be a string, not {type(sie_id).__name__} {shown}; quote it.", model_id=shown, field="sie_id"
        )
    if sie_id:
        validate_model_id(sie_id)
    return dict(data)


def parse_put_document(model_id: str, body: bytes) -> dict[str, Any]:
    """The PUT body for `model_id`: the path id is checked, and the body's `sie_id` must match it (or is set)."""
    validate_model_id(model_id)
    document = parse_yaml_document(body)
    sie_id = document.setdefault("sie_id", model_id)
    if sie_id != model_id:
        raise InvalidModelSpecError(f"Body sie_id '{sie_id}' does not match the model id in the path '{model_id}'.")
    return document


def parse_resolve_request(body: bytes) -> tuple[str, str | None]:
    """`{"model": spec, "bundle"?: name}` → (spec, bundle); 400 parse_error or missing_field."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestParseError(f"Invalid JSON: {exc}") from exc
    if not isinstance(data, Mapping):
        raise RequestParseError("Invalid JSON: expected an object")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise MissingFieldError("Missing required field: model")
    bundle = data.get("bundle")
    return model, bundle if isinstance(bundle, str) and bundle else None
