"""Request bodies: read whole, refused as soon as they pass a byte cap (the declared length is checked first,
so an honest client over the cap is answered before it sends anything). Each surface maps BodyTooLargeError
to its own 413 envelope and BodyIncompleteError (the client left mid-upload, an everyday event logged here
at INFO) to an answer nobody reads; both live in `sie.http.errors`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from typing import Protocol

from starlette.requests import ClientDisconnect

from sie.http.errors import BodyIncompleteError, BodyTooLargeError

logger = logging.getLogger(__name__)


class StreamedRequest(Protocol):
    """What reading a body needs of a request (starlette's Request has it)."""

    @property
    def headers(self) -> Mapping[str, str]: ...

    def stream(self) -> AsyncIterator[bytes]: ...


async def read_body(request: StreamedRequest, limit: int) -> bytes:
    """The whole body; over `limit` bytes (declared or streamed) raises BodyTooLargeError, a client that leaves
    before sending it all BodyIncompleteError."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLargeError(f"Request body of {declared} bytes exceeds the {limit} byte limit", limit)
    chunks = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise BodyTooLargeError(f"Request body exceeds the {limit} byte limit", limit)
            chunks.append(chunk)
    except ClientDisconnect:
        expected = f" of {declared}" if declared else ""
        logger.info("client disconnected after sending %d%s body bytes; the request is dropped", size, expected)
        raise BodyIncompleteError(f"The client disconnected after {size}{expected} body bytes") from None
    return b"".join(chunks)
