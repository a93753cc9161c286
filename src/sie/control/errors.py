"""Errors of the config service's domain; they carry fields, never HTTP status codes (`replies` maps them).

ControlError
├── RequestParseError          the body is not YAML/JSON, or not a mapping
├── InvalidModelSpecError      the request names the model inconsistently (path vs body)
├── MissingFieldError          a required request field is absent
├── ValidationFailedError      the config breaks the schema or routes to no bundle; `details` lists each problem
├── ContentConflictError       an append would change an existing profile or metadata field
├── UnknownModelError          no such model in the registry
├── UnknownBundleError         no such bundle
├── ConfigStoreRequiredError   the operation needs SIE_CONFIG_STORE_DIR
├── RegistryUnavailableError   the bundles failed to load at start-up
├── PublisherUnavailableError  a NATS publisher is configured but not connected
├── IdempotencyMismatchError   an Idempotency-Key reused with another payload
├── InflightCancelledError     the same key's owner was cancelled before it committed
├── InflightAbortedError       the same key's owner failed unexpectedly
├── UnrestoredStoreError       start-up: SIE_CONFIG_RESTORE=false over a store that holds models
└── AuthError                  missing or refused token (status and plain-string detail, as SIE answers)
"""

from __future__ import annotations

from collections.abc import Sequence


class ControlError(Exception):
    """Base class of the config service's domain errors; `message` is shown to the caller."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


class RequestParseError(ControlError):
    """The request body could not be parsed."""


class InvalidModelSpecError(ControlError):
    """The request's model id and body disagree."""


class MissingFieldError(ControlError):
    """A required field of a JSON request body is missing."""


class ValidationFailedError(ControlError):
    """The model config is invalid; one message per problem."""

    def __init__(self, messages: Sequence[str]) -> None:
        self.messages = list(messages)
        super().__init__("; ".join(self.messages))


class ContentConflictError(ControlError):
    """The append-only rule was broken: existing profiles or metadata fields would change."""

    def __init__(self, model_id: str, *, profiles: Sequence[str] = (), fields: Sequence[str] = ()) -> None:
        self.model_id = model_id
        self.conflicting_profiles = sorted(profiles)
        self.conflicting_fields = sorted(fields)
        what = "profiles" if self.conflicting_profiles else "fields"
        names = ", ".join(self.conflicting_profiles or self.conflicting_fields)
        super().__init__(
            f"Model '{model_id}' already exists with different content for {what}: {names}. "
            "Writes are append-only; use PUT to replace the model."
        )


class UnknownModelError(ControlError):
    """The model id is not in the registry."""

    def __init__(self, model_id: str) -> None:
        self.model_id = model_id
        super().__init__(f"Model '{model_id}' does not exist in the catalog.")


class UnknownBundleError(ControlError):
    """The bundle id is not loaded."""

    def __init__(self, bundle_id: str) -> None:
        self.bundle_id = bundle_id
        super().__init__(f"Bundle '{bundle_id}' does not exist.")


class ConfigStoreRequiredError(ControlError):
    """Deleting needs a persistent store: without one the baseline would come back on restart."""


class RegistryUnavailableError(ControlError):
    """The registry failed to initialise (e.g. a malformed bundle YAML); see the start-up log."""


class PublisherUnavailableError(ControlError):
    """NATS is configured but disconnected: writes are refused so no delta is silently lost."""


class IdempotencyMismatchError(ControlError):
    """The Idempotency-Key was already used with a different payload."""


class InflightCancelledError(ControlError):
    """The request owning this Idempotency-Key was cancelled before committing; retrying is safe."""


class InflightAbortedError(ControlError):
    """The request owning this Idempotency-Key failed unexpectedly."""


class UnrestoredStoreError(ControlError):
    """Start-up refused: serving the stored epoch without the stored models would tell gateways they are current."""


class AuthError(ControlError):
    """A missing or refused bearer token; `unauthenticated` means no token was sent (401)."""

    def __init__(self, message: str, *, unauthenticated: bool = False) -> None:
        self.unauthenticated = unauthenticated
        super().__init__(message)
