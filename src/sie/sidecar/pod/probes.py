"""The sidecar's Kubernetes probes on SIE_WORKER_PROBE_PORT (seed 001 "Readiness, Health, And Telemetry"):
`/healthz` is liveness (200 while the process serves), `/readyz` asks a readiness callable (200 or 503).
Optionally it also serves a framework-free `routes` handler (the placement control surface and `/metrics`).
A minimal HTTP/1.1 responder on asyncio streams, one request per connection; no web framework.
"""

from __future__ import annotations

import asyncio
import http
import logging
from collections.abc import Callable, Mapping
from typing import Final, NamedTuple, Self
from urllib.parse import parse_qsl, unquote

from sie.http.plain import MAX_BODY_BYTES, PlainHandler

logger = logging.getLogger(__name__)

HEALTHZ_PATH: Final = "/healthz"
READYZ_PATH: Final = "/readyz"
TEXT_CONTENT_TYPE: Final = "text/plain; charset=utf-8"
# A probe sends a few hundred bytes at once; a client slower or larger than this is dropped.
READ_TIMEOUT_S: Final = 5.0
MAX_HEADER_LINES: Final = 100
MAX_LINE_BYTES: Final = 8192


class _Request(NamedTuple):
    method: str
    target: str
    headers: dict[str, str]


class _Refusal(Exception):
    """A request refused before it reaches a handler: status and plain-text reason."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


class ProbeServer:
    """`/healthz`, `/readyz` and, when given, `routes` on `host:port` (port 0 picks a free port; `port` tells
    which after start). The sidecar role binds SIE_WORKER_PROBE_HOST (every interface, for the kubelet); `host`
    defaults to loopback."""

    def __init__(
        self,
        ready: Callable[[], bool],
        port: int,
        host: str = "127.0.0.1",
        routes: PlainHandler | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        self._ready = ready
        self._requested_port = port
        self.host = host
        self._routes = routes
        self._max_body_bytes = max_body_bytes
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    @property
    def port(self) -> int:
        """The bound port; raises RuntimeError before the server started."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("the probe server is not listening")
        return int(self._server.sockets[0].getsockname()[1])

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(
            self._serve, self.host, self._requested_port, limit=MAX_LINE_BYTES, reuse_address=True
        )
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        connections = dict(self._connections)
        for task, writer in connections.items():
            writer.close()
            task.cancel()  # a handler may be waiting (a repack waits up to minutes): exit does not wait for it
        await asyncio.gather(*connections, return_exceptions=True)
        await server.wait_closed()

    def answer(self, method: str, path: str) -> tuple[int, str]:
        """The status and plain-text body for one request line."""
        path = path.split("?", 1)[0]
        if path not in (HEALTHZ_PATH, READYZ_PATH):
            return 404, "not found"
        if method not in ("GET", "HEAD"):
            return 405, "method not allowed"
        if path == HEALTHZ_PATH or self._is_ready():
            return 200, "ok"
        return 503, "not ready"

    async def respond(self, method: str, target: str, body: bytes) -> tuple[int, str, bytes]:
        """The status, content type and body for one request: the probes first, then `routes`."""
        raw_path, _, query = target.partition("?")
        path = unquote(raw_path)
        if self._routes is not None and path not in (HEALTHZ_PATH, READYZ_PATH):
            answer = await _route(self._routes, method, path, query, body)
            if answer is not None:
                return answer
        status, text = self.answer(method, path)
        return status, TEXT_CONTENT_TYPE, text.encode()

    def _is_ready(self) -> bool:
        try:
            return bool(self._ready())
        except Exception:  # noqa: BLE001 - a failing readiness check means "not ready", not a dead probe server
            logger.exception("the readiness check failed")
            return False

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections[task] = writer
        try:
            request = await _read_request(reader)
            status, content_type, payload = await self._answer(reader, request)
            head_only = request is not None and request.method == "HEAD"
            writer.write(_response(status, content_type, payload, head_only))
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, TimeoutError):
            pass  # the client went away or sent garbage: nothing to answer
        finally:
            if task is not None:
                self._connections.pop(task, None)
            writer.close()

    async def _answer(self, reader: asyncio.StreamReader, request: _Request | None) -> tuple[int, str, bytes]:
        if request is None:
            return 400, TEXT_CONTENT_TYPE, b"bad request"
        try:
            body = await _read_body(reader, request.headers, self._max_body_bytes)
        except _Refusal as refusal:
            return refusal.status, TEXT_CONTENT_TYPE, refusal.text.encode()
        return await self.respond(request.method, request.target, body)


async def _route(
    routes: PlainHandler, method: str, path: str, query: str, body: bytes
) -> tuple[int, str, bytes] | None:
    try:
        reply = await routes(
            "GET" if method == "HEAD" else method, path, dict(parse_qsl(query, keep_blank_values=True)), body
        )
    except Exception:  # noqa: BLE001 - a failing handler answers 500 and the probes keep serving
        logger.exception("the handler of %s %s failed", method, path)
        return 500, TEXT_CONTENT_TYPE, b"internal error"
    return None if reply is None else (reply.status, reply.content_type, reply.body)


async def _read_request(reader: asyncio.StreamReader) -> _Request | None:
    """The request line and headers (names lower-cased); None when it is not HTTP."""
    headers: dict[str, str] = {}
    async with asyncio.timeout(READ_TIMEOUT_S):
        parts = (await reader.readline()).decode("latin-1").split()
        for _ in range(MAX_HEADER_LINES):
            line = (await reader.readline()).decode("latin-1").strip()
            if not line:
                break
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        else:
            return None
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return None
    return _Request(parts[0], parts[1], headers)


async def _read_body(reader: asyncio.StreamReader, headers: Mapping[str, str], limit: int) -> bytes:
    """The body by Content-Length (none without one); refused when chunked, malformed or over `limit`."""
    if "transfer-encoding" in headers:
        raise _Refusal(411, "length required")
    declared = headers.get("content-length", "0")
    if not declared.isdigit():
        raise _Refusal(400, "bad content-length")
    if int(declared) > limit:
        raise _Refusal(413, f"the body is over the {limit} byte limit")
    if int(declared) == 0:
        return b""
    async with asyncio.timeout(READ_TIMEOUT_S):
        return await reader.readexactly(int(declared))


def _response(status: int, content_type: str, payload: bytes, head_only: bool) -> bytes:
    try:
        reason = http.HTTPStatus(status).phrase
    except ValueError:  # a handler's own status code: the reason phrase is optional in HTTP/1.1
        reason = ""
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(payload)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + (b"" if head_only else payload)


__all__ = ["HEALTHZ_PATH", "READYZ_PATH", "ProbeServer"]
