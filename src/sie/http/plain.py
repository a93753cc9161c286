"""A plain handler: framework-free async `(method, path, query, body) -> reply or None`, served by the gateway's
starlette app (`sie.http.handlers`) and by the sidecar's probe server alike, and `first_answer` chaining several.
No web framework here, so the sidecar may import it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Final, Protocol

# The transport's cap on a request body; a handler may refuse smaller bodies in its own envelope.
MAX_BODY_BYTES: Final = 1024 * 1024


class PlainReply(Protocol):
    """What a plain handler answers (sie.placement.api.ApiResponse is one)."""

    @property
    def status(self) -> int: ...

    @property
    def content_type(self) -> str: ...

    @property
    def body(self) -> bytes: ...


# (method, percent-decoded path, query with the last value of each name, body) -> the answer, or None when the
# path is not the handler's. HEAD reaches it as GET; the server drops the body.
PlainHandler = Callable[[str, str, Mapping[str, str], bytes], Awaitable[PlainReply | None]]


def first_answer(*handlers: PlainHandler) -> PlainHandler:
    """One handler asking `handlers` in order: the first that answers (not None) wins."""

    async def handle(method: str, path: str, query: Mapping[str, str], body: bytes) -> PlainReply | None:
        for handler in handlers:
            reply = await handler(method, path, query, body)
            if reply is not None:
                return reply
        return None

    return handle
