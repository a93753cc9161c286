"""The converter's single error type; it carries the file (and tensor) a conversion failed on.

ConversionError   a missing, malformed or unsupported config value or tensor
"""

from __future__ import annotations


class ConversionError(Exception):
    """A checkpoint that cannot be converted; the message names the file and the offending tensor."""

    def __init__(self, message: str, *, source: str = "", tensor: str | None = None) -> None:
        self.message = message
        self.source = source
        self.tensor = tensor
        super().__init__(self.describe())

    def describe(self) -> str:
        where = self.source or "<checkpoint>"
        if self.tensor is not None:
            where = f"{where}: tensor {self.tensor!r}"
        return f"{where}: {self.message}"
