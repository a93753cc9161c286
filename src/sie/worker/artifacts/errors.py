"""Artifact failures, classified for the model manager's failure states (contracts Part B §5.2).

    ArtifactError              every failure that leaves `resolve`: error_class, model, cause
    └── ArtifactUnavailable    only the Hub could serve the model and Hub downloads are off
    FetchError                 one source failed; internal, wrapped into ArtifactError by the resolver

The caller decides what a class means (NETWORK gets a cooldown, the others stick until the config
changes); this package only classifies.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorClass(StrEnum):
    """The load-failure classes of contracts Part B §5.2 that fetching files can produce."""

    NOT_FOUND = "NOT_FOUND"
    NETWORK = "NETWORK"
    DEPENDENCY = "DEPENDENCY"
    GATED = "GATED"
    UNKNOWN = "UNKNOWN"


class FetchError(Exception):
    """One source could not deliver its files; `detail` says why without naming the model."""

    def __init__(self, error_class: ErrorClass, detail: str) -> None:
        self.error_class = error_class
        self.detail = detail
        super().__init__(detail)


class ArtifactError(Exception):
    """A model's files could not be made available locally; the message names the model and the cause."""

    def __init__(self, error_class: ErrorClass, model: str, detail: str) -> None:
        self.error_class = error_class
        self.model = model
        self.detail = detail
        super().__init__(f"Model '{model}': {detail}")


class ArtifactUnavailable(ArtifactError):
    """The Hub is the only source left and Hub downloads are off (offline); permanent until reconfigured."""
