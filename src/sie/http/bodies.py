"""Request bodies: read whole, refused as soon as they pass a byte cap (the declared length is checked first,
so an honest client over the cap is answered before it sends anything). Each surface maps
BodyTooLargeError to its own 413 envelope; nothing here imports a web framework, so error mappings may
import it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Protocol


class StreamedRequest(Protocol):
    """What reading a body needs of a request (starlette's Request has it)."""

    @property
    def headers(self) -> Mapping[str, str]: ...

    def stream(self) -> AsyncIterator[bytes]: ...


class BodyTooLargeError(Exception):
    """The request body is over the surface's limit; `limit` is that limit in bytes."""

    def __init__(self, message: str, limit: int) -> None:
        super().__init__(message)
        self.message = message
        self.limit = limit


async def read_body(request: StreamedRequest, limit: int) -> bytes:
    """The whole body; over `limit` bytes (declared or streamed) raises BodyTooLargeError."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLargeError(f"Request body of {declared} bytes exceeds the {limit} byte limit", limit)
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLargeError(f"Request body exceeds the {limit} byte limit", limit)
        chunks.append(chunk)
    return b"".join(chunks)
