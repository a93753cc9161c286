"""HTTP/2 by prior knowledge (h2c) on uvicorn's bind.

uvicorn's httptools protocol serves HTTP/1.1 with a fraction of hypercorn's CPU per request but speaks no HTTP/2.
`FirstBytes` is the protocol uvicorn makes for each new connection: it reads the opening bytes, and a connection
that asks for HTTP/2 is handed, bytes and all, to hypercorn's connection server (`H2cHandOff`), which serves it as
it would on its own bind: one that opens with the HTTP/2 connection preface (prior knowledge:
`httpx.AsyncClient(http1=False, http2=True)`, gRPC-style clients) or whose first request carries `Upgrade: h2c`
(`curl --http2`; hypercorn upgrades it, or answers over HTTP/1.1 where the request has a body — uvicorn would drop
that body). Any other connection becomes uvicorn's HTTP/1.1 protocol from its first request on, with nothing in its
path after that.

uvicorn's graceful shutdown covers both kinds: a handed-off connection sits in uvicorn's connection and task sets
until it closes, and uvicorn's `shutdown()` of it is hypercorn's signal to finish open streams and close.

hypercorn is imported with the first handed-off connection, not with this module: most servers never see an h2c
client, and importing hypercorn's server costs every `sie run` process about 0.1 s of CPU at start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

if TYPE_CHECKING:
    import hypercorn.config
    from hypercorn.app_wrappers import ASGIWrapper
    from hypercorn.asyncio.worker_context import WorkerContext

# RFC 9113 §3.4: what a client speaking HTTP/2 by prior knowledge sends first.
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# A first request head longer than this goes to uvicorn undecided (it applies its own limits to it).
MAX_OPENING_HEAD = 64 * 1024

App = Callable[..., Awaitable[None]]


class H2cHandOff:
    """Serves the connections `FirstBytes` hands off with hypercorn; one worker context, so one shutdown signal
    reaches them all. `hypercorn_config` is called, and hypercorn imported, when the first connection comes."""

    def __init__(self, app: App, hypercorn_config: Callable[[], hypercorn.config.Config]) -> None:
        self._app = app
        self._hypercorn_config = hypercorn_config
        self._server: tuple[ASGIWrapper, hypercorn.config.Config, WorkerContext] | None = None
        self._terminating: asyncio.Task[None] | None = None

    def serve(self, transport: asyncio.Transport, opening: bytes, server_state: ServerState, app_state: dict) -> None:
        """Serve the connection on `transport`, whose first bytes `opening` were already read, until it closes."""
        from hypercorn.asyncio.tcp_server import TCPServer

        wrapped, config, context = self._hypercorn()
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(loop=loop)
        stream_protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        transport.set_protocol(stream_protocol)
        stream_protocol.connection_made(transport)
        reader.feed_data(opening)
        writer = asyncio.StreamWriter(transport, stream_protocol, reader, loop)
        server = TCPServer(wrapped, loop, config, context, app_state, reader, writer)
        task = loop.create_task(server.run())
        connection = _HandedOff(self)
        server_state.connections.add(connection)  # type: ignore[arg-type]  # uvicorn only calls shutdown() on it
        server_state.tasks.add(task)

        def closed(_: asyncio.Task[None]) -> None:
            server_state.connections.discard(connection)  # type: ignore[arg-type]
            server_state.tasks.discard(task)

        task.add_done_callback(closed)

    def terminate(self) -> None:
        """Tell every handed-off connection to finish its open streams and close (the server is shutting down)."""
        if self._server is not None and self._terminating is None:
            context = self._server[2]
            self._terminating = asyncio.get_running_loop().create_task(context.terminated.set())

    def _hypercorn(self) -> tuple[ASGIWrapper, hypercorn.config.Config, WorkerContext]:
        if self._server is None:
            from hypercorn.app_wrappers import ASGIWrapper
            from hypercorn.asyncio.worker_context import WorkerContext

            self._server = (ASGIWrapper(self._app), self._hypercorn_config(), WorkerContext(max_requests=None))
        return self._server


class _HandedOff:
    """A handed-off connection as uvicorn's shutdown sees it."""

    def __init__(self, hand_off: H2cHandOff) -> None:
        self._hand_off = hand_off

    def shutdown(self) -> None:
        self._hand_off.terminate()


def asks_for_h2c(head: bytes) -> bool:
    """Whether an HTTP/1.1 request head (without its closing blank line) asks to upgrade to h2c."""
    if b"h2c" not in head.lower():
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"upgrade" and b"h2c" in (token.strip().lower() for token in value.split(b",")):
            return True
    return False


class FirstBytes(asyncio.Protocol):
    """A new connection until its first bytes say which protocol serves it: HTTP/2 (the preface, or an `Upgrade: h2c`
    first request) goes to `h2c`, anything else to uvicorn's httptools HTTP/1.1 protocol. A connection that sends
    nothing is closed after uvicorn's keep-alive timeout, as an idle HTTP/1.1 connection would be."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        h2c: H2cHandOff,
    ) -> None:
        self._config = config
        self._server_state = server_state
        self._app_state = app_state
        self._loop = _loop or asyncio.get_event_loop()
        self._h2c = h2c
        self._transport: asyncio.Transport  # set by connection_made, which asyncio calls first
        self._opening = b""
        self._silence: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast("asyncio.Transport", transport)  # uvloop's transports do not subclass asyncio's
        self._server_state.connections.add(self)  # type: ignore[arg-type]
        self._silence = self._loop.call_later(self._config.timeout_keep_alive, self._transport.close)

    def connection_lost(self, exc: Exception | None) -> None:
        self._settled()

    def shutdown(self) -> None:
        """uvicorn is shutting down: a connection that has not yet asked for anything is closed."""
        self._transport.close()

    def data_received(self, data: bytes) -> None:
        opening = self._opening + data
        if len(opening) < len(PREFACE) and PREFACE.startswith(opening):
            self._opening = opening  # could still be the preface
            return
        head_end = opening.find(b"\r\n\r\n")  # the preface holds one too: a whole preface never waits here
        if head_end < 0 and len(opening) < MAX_OPENING_HEAD:
            self._opening = opening  # the first request's head is not all here yet
            return
        self._settled()
        if opening.startswith(PREFACE) or (head_end >= 0 and asks_for_h2c(opening[:head_end])):
            self._h2c.serve(self._transport, opening, self._server_state, self._app_state)
            return
        http1 = HttpToolsProtocol(self._config, self._server_state, self._app_state, self._loop)
        self._transport.set_protocol(http1)
        http1.connection_made(self._transport)
        http1.data_received(opening)

    def _settled(self) -> None:
        self._server_state.connections.discard(self)  # type: ignore[arg-type]
        if self._silence is not None:
            self._silence.cancel()
            self._silence = None
