"""The one mapping from exceptions to the config service's HTTP error answers (contracts Part A §2.4).

Rules are looked up along the exception's MRO. Domain errors answer `{"detail": {"error", "message", ...}}`;
auth errors answer `{"detail": "<string>"}` as SIE does. Pure: plain data, no web framework.
"""

from __future__ import annotations

from typing import Any, Final

import attrs

from sie.catalog.errors import BundleConflictError, InvalidModelIdError, ModelNotFoundError
from sie.control import errors
from sie.http.errors import BodyIncompleteError, BodyTooLargeError

INTERNAL_ERROR: Final = "internal_error"


@attrs.frozen
class ErrorReply:
    """A rendered error: status and JSON-ready body."""

    status: int
    body: dict[str, Any]


RULES: Final[dict[type[BaseException], tuple[int, str]]] = {
    errors.RequestParseError: (400, "parse_error"),
    InvalidModelIdError: (400, "invalid_model_id"),
    errors.MissingFieldError: (400, "missing_field"),
    errors.InvalidModelSpecError: (400, "invalid_model_spec"),
    errors.UnknownModelError: (404, "model_not_found"),
    ModelNotFoundError: (404, "model_not_found"),
    errors.UnknownBundleError: (404, "bundle_not_found"),
    BundleConflictError: (409, "bundle_conflict"),
    errors.ContentConflictError: (409, "content_conflict"),
    errors.ConfigStoreRequiredError: (409, "config_store_required"),
    BodyTooLargeError: (413, "payload_too_large"),
    # nginx's "client closed request": the client left mid-upload, nobody reads it (logged at INFO).
    BodyIncompleteError: (499, "client_disconnected"),
    errors.ValidationFailedError: (422, "validation_error"),
    errors.IdempotencyMismatchError: (422, "idempotency_mismatch"),
    errors.PublisherUnavailableError: (503, "nats_unavailable"),
    errors.RegistryUnavailableError: (503, "registry_unavailable"),
    errors.InflightCancelledError: (503, "idempotent_inflight_cancelled"),
    errors.InflightAbortedError: (503, "idempotent_inflight_aborted"),
}


def _rule(exc: BaseException) -> tuple[int, str] | None:
    for cls in type(exc).__mro__:
        if cls in RULES:
            return RULES[cls]
    return None


def _fields(exc: BaseException) -> dict[str, Any]:
    """The extra envelope fields each error carries besides `error` and `message`."""
    if isinstance(exc, errors.ValidationFailedError):
        return {"details": [{"message": message} for message in exc.messages]}
    if isinstance(exc, errors.ContentConflictError):
        key = "conflicting_profiles" if exc.conflicting_profiles else "conflicting_fields"
        return {"model_id": exc.model_id, key: getattr(exc, key)}
    if isinstance(exc, errors.UnknownModelError | InvalidModelIdError):
        return {"model_id": exc.model_id}
    if isinstance(exc, ModelNotFoundError):
        return {"model_id": exc.model_id, "model": exc.model_id}
    if isinstance(exc, errors.UnknownBundleError):
        return {"bundle_id": exc.bundle_id}
    if isinstance(exc, BundleConflictError):
        return {"model": exc.model_id, "bundle": exc.bundle, "compatible_bundles": exc.compatible_bundles}
    return {}


def _message(exc: BaseException) -> str:
    if isinstance(exc, errors.ControlError | InvalidModelIdError | BodyTooLargeError):
        return exc.message
    return str(exc)


def error_reply(exc: BaseException) -> ErrorReply:
    """The status and body answering `exc`; an unmapped exception is a 500 that hides its text."""
    if isinstance(exc, errors.AuthError):
        return ErrorReply(401 if exc.unauthenticated else 403, {"detail": exc.message})
    rule = _rule(exc)
    if rule is None:
        return ErrorReply(500, {"detail": {"error": INTERNAL_ERROR, "message": "Internal server error"}})
    status, code = rule
    return ErrorReply(status, {"detail": {"error": code, "message": _message(exc), **_fields(exc)}})
