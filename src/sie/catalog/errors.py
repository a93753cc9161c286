"""Errors the catalog raises; it never knows HTTP status codes, the surfaces map these.

CatalogError
├── ConfigError             one bad value in one file: source, model, field
│   └── InvalidModelIdError an id that breaks the id rules
├── CatalogErrors           several ConfigErrors found in one pass
├── ModelNotFoundError      no such model, or no bundle can serve it
└── BundleConflictError     a bundle override the model cannot run on
"""

from __future__ import annotations

from collections.abc import Sequence


class CatalogError(Exception):
    """Base class of every catalog error."""


class ConfigError(CatalogError):
    """One invalid value, located by source file, model id and dotted field path."""

    def __init__(
        self, message: str, *, source: str = "", model_id: str | None = None, field: str | None = None
    ) -> None:
        self.message = message
        self.source = source
        self.model_id = model_id
        self.field = field
        super().__init__(self.describe())

    def describe(self) -> str:
        parts = [self.source] if self.source else []
        if self.model_id:
            parts.append(f"model '{self.model_id}'")
        if self.field:
            parts.append(self.field)
        parts.append(self.message)
        return ": ".join(parts)


class InvalidModelIdError(ConfigError):
    """A model id that does not match the id rules."""


class CatalogErrors(CatalogError):
    """Every ConfigError found while checking a set of files."""

    def __init__(self, errors: Sequence[ConfigError]) -> None:
        self.errors = list(errors)
        super().__init__("\n".join(error.describe() for error in self.errors))


class ModelNotFoundError(CatalogError):
    """The model id is unknown, or none of its profiles runs on any bundle."""

    def __init__(self, model_id: str, message: str | None = None) -> None:
        self.model_id = model_id
        super().__init__(message or f"Model '{model_id}' not found")


class BundleConflictError(CatalogError):
    """A `bundle:/model` override names a bundle that cannot run the model."""

    def __init__(self, model_id: str, bundle: str, compatible_bundles: Sequence[str]) -> None:
        self.model_id = model_id
        self.bundle = bundle
        self.compatible_bundles = list(compatible_bundles)
        super().__init__(
            f"Model '{model_id}' cannot run on bundle '{bundle}'; compatible bundles: {self.compatible_bundles}"
        )
