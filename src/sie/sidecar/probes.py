"""The sidecar's Kubernetes probes on SIE_WORKER_PROBE_PORT (seed 001 "Readiness, Health, And Telemetry"):
`/healthz` is liveness (200 while the process serves), `/readyz` asks a readiness callable (200 or 503).
A minimal HTTP/1.1 responder on asyncio streams, one request per connection; no web framework.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final, Self

logger = logging.getLogger(__name__)

HEALTHZ_PATH: Final = "/healthz"
READYZ_PATH: Final = "/readyz"
# A probe sends a few hundred bytes at once; a client slower or larger than this is dropped.
READ_TIMEOUT_S: Final = 5.0
MAX_HEADER_LINES: Final = 100
MAX_LINE_BYTES: Final = 8192

_REASONS: Final = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}


class ProbeServer:
    """`/healthz` and `/readyz` on `host:port` (port 0 picks a free port; `port` tells which after start)."""

    def __init__(self, ready: Callable[[], bool], port: int, host: str = "0.0.0.0") -> None:
        self._ready = ready
        self._requested_port = port
        self.host = host
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
        for writer in connections.values():
            writer.close()
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
            status, body = self.answer(*request) if request else (400, "bad request")
            head_only = request is not None and request[0] == "HEAD"
            writer.write(_response(status, body, head_only))
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, TimeoutError):
            pass  # the client went away or sent garbage: nothing to answer
        finally:
            if task is not None:
                self._connections.pop(task, None)
            writer.close()


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str] | None:
    """`(method, path)` of one request, its headers read and discarded; None when it is not HTTP."""
    async with asyncio.timeout(READ_TIMEOUT_S):
        parts = (await reader.readline()).decode("latin-1").split()
        for _ in range(MAX_HEADER_LINES):
            if (await reader.readline()).strip() == b"":
                break
        else:
            return None
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return None
    return parts[0], parts[1]


def _response(status: int, body: str, head_only: bool) -> bytes:
    payload = body.encode()
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(payload)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + (b"" if head_only else payload)


__all__ = ["HEALTHZ_PATH", "READYZ_PATH", "ProbeServer"]
