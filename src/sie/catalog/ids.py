"""Model id rules: validation, subject-token normalisation and the `bundle:/model` spec grammar.

Exact rules from contracts Part A §2.2/§2.4 and Part B §3.3/§3.6; nothing here does I/O.
"""

from __future__ import annotations

import re

import attrs

from sie.catalog.errors import InvalidModelIdError

MODEL_ID_PATTERN = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._/:@-]*$")
POOL_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
BUNDLE_OVERRIDE_SEPARATOR = ":/"

_SUBJECT_TOKEN_REPLACEMENTS = (("/", "__"), (".", "_dot_"), ("*", "_"), (">", "_"), (" ", "_"))


def validate_model_id(model_id: str) -> None:
    """Raise InvalidModelIdError unless `model_id` is a legal catalogue id (sie-config rules)."""
    if ".." in model_id or "\\" in model_id or not MODEL_ID_PATTERN.match(model_id):
        raise InvalidModelIdError("Model ID contains invalid characters.", model_id=model_id, field="sie_id")
    if model_id == "status" or model_id.endswith("/status"):
        raise InvalidModelIdError(
            "Model ID must not end with '/status' (reserved for the gateway status endpoint).",
            model_id=model_id,
            field="sie_id",
        )


def normalize_model_id(model_id: str) -> str:
    """Map a model id onto one NATS subject token: `/`→`__`, `.`→`_dot_`, `*`/`>`/space→`_`, in order."""
    token = model_id
    for old, new in _SUBJECT_TOKEN_REPLACEMENTS:
        token = token.replace(old, new)
    return token


def denormalize_model_id(token: str) -> str:
    """Best-effort inverse of normalize_model_id (`__`→`/`, `_dot_`→`.`)."""
    return token.replace("_dot_", ".").replace("__", "/")


def normalize_worker_id(worker_id: str) -> str:
    """Like normalize_model_id, but an empty or blank worker id is an error."""
    if not worker_id.strip():
        raise ValueError("worker id must not be empty")
    return normalize_model_id(worker_id)


def is_valid_pool_name(pool: str) -> bool:
    """Pool names are `[A-Za-z0-9_-]{1,128}` and never the reserved `_default`."""
    return bool(POOL_NAME_PATTERN.match(pool)) and pool != "_default"


@attrs.frozen
class ModelSpec:
    """A parsed request path: an optional bundle override and the model id (which may name a variant)."""

    model_id: str
    bundle: str | None = None


def parse_model_spec(spec: str) -> ModelSpec:
    """Split `bundle:/org/model[:variant]` into its bundle override (lower-cased) and model id."""
    bundle, separator, rest = spec.partition(BUNDLE_OVERRIDE_SEPARATOR)
    if not separator:
        return ModelSpec(model_id=spec)
    return ModelSpec(model_id=rest, bundle=bundle.strip().lower() or None)
