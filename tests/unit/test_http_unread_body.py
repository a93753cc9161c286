"""`CloseOnUnreadBody`: an HTTP/1 answer that starts before the app received the whole request body says
`Connection: close`; answers after the body, requests without one, and HTTP/2 pass unchanged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sie.http.unread_body import CloseOnUnreadBody, has_body

Message = dict[str, Any]


def scope(headers: list[tuple[bytes, bytes]], http_version: str = "1.1") -> dict[str, Any]:
    return {"type": "http", "http_version": http_version, "method": "PUT", "path": "/", "headers": headers}


def answering(reads: int) -> Callable[..., Any]:
    """An app that receives `reads` messages, then answers 405."""

    async def app(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        for _ in range(reads):
            await receive()
        await send({"type": "http.response.start", "status": 405, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    return app


async def run(app: Callable[..., Any], request_scope: dict[str, Any], chunks: list[Message]) -> list[Message]:
    sent: list[Message] = []
    pending = list(chunks)

    async def receive() -> Message:
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    await CloseOnUnreadBody(app)(request_scope, receive, send)
    return sent


BODY = [(b"content-length", b"5")]
TWO_CHUNKS = [
    {"type": "http.request", "body": b"he", "more_body": True},
    {"type": "http.request", "body": b"llo", "more_body": False},
]


@pytest.mark.parametrize("reads", [0, 1])
async def test_an_answer_before_the_last_chunk_says_close(reads: int) -> None:
    start = (await run(answering(reads), scope(BODY), TWO_CHUNKS))[0]
    assert start["headers"] == [(b"content-length", b"0"), (b"connection", b"close")]


@pytest.mark.parametrize(
    ("request_scope", "reads"),
    [
        (scope(BODY), 2),  # the whole body was read
        (scope([(b"content-length", b"0")]), 0),  # no body to read
        (scope([]), 0),
        (scope(BODY, http_version="2"), 0),  # HTTP/2 has no Connection header
    ],
)
async def test_other_answers_pass_unchanged(request_scope: dict[str, Any], reads: int) -> None:
    start = (await run(answering(reads), request_scope, TWO_CHUNKS))[0]
    assert start["headers"] == [(b"content-length", b"0")]


async def test_a_disconnect_leaves_nothing_unread() -> None:
    start = (await run(answering(1), scope(BODY), []))[0]
    assert (b"connection", b"close") not in start["headers"]


async def test_other_scopes_pass_through() -> None:
    seen = []

    async def app(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        seen.append((scope["type"], receive, send))

    async def receive() -> Message:
        return {}

    async def send(message: Message) -> None:
        return None

    await CloseOnUnreadBody(app)({"type": "lifespan"}, receive, send)
    assert seen == [("lifespan", receive, send)]


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([(b"Content-Length", b"12")], True),
        ([(b"content-length", b"0")], False),
        ([(b"Transfer-Encoding", b"chunked")], True),
        ([(b"accept", b"*/*")], False),
    ],
)
def test_has_body(headers: list[tuple[bytes, bytes]], expected: bool) -> None:
    assert has_body(headers) is expected
