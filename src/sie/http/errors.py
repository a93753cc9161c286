"""What can go wrong reading a request body, as plain exceptions: each surface maps them to its own envelope,
and the mapping modules that must stay free of the web framework can name them (`sie.http.bodies` raises them)."""

from __future__ import annotations


class BodyTooLargeError(Exception):
    """The request body is over the surface's limit; `limit` is that limit in bytes."""

    def __init__(self, message: str, limit: int) -> None:
        super().__init__(message)
        self.message = message
        self.limit = limit


class BodyIncompleteError(Exception):
    """The client disconnected before it sent the whole body; nobody will read the answer."""
