"""Model load failures as the worker reports them: a class from contracts Part B §5.2 and a message.

    ModelLoadError   error_class (NOT_FOUND | DEPENDENCY | OOM | NETWORK | GATED | UNKNOWN), message

Permanent classes stick until the model's config changes; OOM and NETWORK have a cooldown
(`LOAD_FAILURE_COOLDOWN_S`) after which a new request may try again.
"""

from __future__ import annotations

PERMANENT_CLASSES = frozenset({"NOT_FOUND", "DEPENDENCY", "GATED", "UNKNOWN"})
LOAD_FAILURE_COOLDOWN_S = {"OOM": 60.0, "NETWORK": 30.0}


class ModelLoadError(Exception):
    """A model could not be loaded; `error_class` decides whether and when to retry."""

    def __init__(self, error_class: str, message: str) -> None:
        self.error_class = error_class
        self.message = message
        super().__init__(message)

    @property
    def permanent(self) -> bool:
        return self.error_class in PERMANENT_CLASSES
