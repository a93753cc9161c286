"""Exceptions raised by the wire layer: decoding bodies and mapping them onto message types.

WireError
├── DecodeError   a corrupt msgpack/JSON body, or a field of the wrong type or shape (HTTP 400)
└── EncodeError   a value with no wire form; a programmer error, never the caller's fault
"""

from __future__ import annotations


class WireError(Exception):
    """Base class of every error raised by `sie.wire`."""


class DecodeError(WireError):
    """A body that cannot be read: malformed bytes, or a value that does not fit its message type.

    `message` is msgspec-style (``Expected `str | null`, got `int` ``) and `path` locates the
    bad value (``$.items[0].text``); `str(error)` joins them the way msgspec does.
    """

    def __init__(self, message: str, path: str = "$") -> None:
        self.message = message
        self.path = path
        super().__init__(message if path == "$" else f"{message} - at `{path}`")


class EncodeError(WireError, TypeError):
    """A value that has no wire form (for example an object-dtype array)."""
