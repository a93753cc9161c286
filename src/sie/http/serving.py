"""Serve an ASGI app over HTTP until SIGTERM/SIGINT, then shut down gracefully: refuse new requests, let
in-flight ones finish up to the grace period, then stop the listener.

Two servers, picked by SIE_HTTP_SERVER: uvicorn (the default) serves HTTP/1.1 with the httptools parser, far less
CPU per request than hypercorn, and hands the connections that ask for HTTP/2 on the same bind to hypercorn
(`sie.http.h2c`); hypercorn serves HTTP/1.1 and h2c all by itself. Both run on the role's own event loop; the role,
not the server, owns the signals. Each request gets one access line (sie.access); the servers' own access logs
stay off.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

import attrs
import uvicorn

from sie.http.h2c import FirstBytes, H2cHandOff
from sie.http.unread_body import CloseOnUnreadBody

if TYPE_CHECKING:
    import hypercorn.config

logger = logging.getLogger(__name__)

# Idle keep-alive connections stay open this long (the public SIE server's uvicorn setting).
KEEP_ALIVE_S = 120

App = Callable[..., Awaitable[None]]


@attrs.frozen
class HttpListener:
    """Where and how to serve: the bind, the drain deadline and which server (SIE_HTTP_SERVER)."""

    host: str
    port: int
    grace_s: float
    server: str = "uvicorn"


async def serve_http(app: App, listener: HttpListener, stop: asyncio.Event) -> None:
    """Serve `app` until `stop` is set; then close the listener and let open requests finish for up to
    `grace_s`. Raises ValueError for an unknown server name."""
    try:
        serve = _SERVERS[listener.server]
    except KeyError:
        raise ValueError(f"unknown HTTP server {listener.server!r}; expected one of {sorted(_SERVERS)}") from None
    logger.info("listening on http://%s:%d (%s)", listener.host, listener.port, listener.server)
    await serve(app, listener, stop)


async def serve_until_signalled(app: App, listener: HttpListener, on_shutdown: Callable[[], Awaitable[None]]) -> None:
    """Serve; on SIGTERM or SIGINT await `on_shutdown()` (drain), then stop the server."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    shutdown_task: asyncio.Task[None] | None = None

    async def shut_down() -> None:
        try:
            await on_shutdown()
        finally:
            stop.set()

    def on_signal() -> None:
        nonlocal shutdown_task
        if shutdown_task is None:
            logger.info("shutting down: refusing new requests, finishing in-flight ones")
            shutdown_task = loop.create_task(shut_down())

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal)
    try:
        await serve_http(app, listener, stop)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        if shutdown_task is not None:
            await shutdown_task


def hypercorn_config(listener: HttpListener) -> hypercorn.config.Config:
    import hypercorn.config  # imported when hypercorn serves (SIE_HTTP_SERVER=hypercorn, or an h2c connection)

    config = hypercorn.config.Config()
    config.bind = [f"{listener.host}:{listener.port}"]
    config.graceful_timeout = listener.grace_s
    config.keep_alive_timeout = KEEP_ALIVE_S
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    return config


async def _serve_hypercorn(app: App, listener: HttpListener, stop: asyncio.Event) -> None:
    import hypercorn.asyncio

    # hypercorn drops a kept-alive connection after an answer given before the body was read, without saying so.
    await hypercorn.asyncio.serve(CloseOnUnreadBody(app), hypercorn_config(listener), shutdown_trigger=stop.wait)


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn on a loop it does not own: the role handles SIGTERM/SIGINT (uvicorn would replace the
    loop's handlers and re-raise the signal after shutdown)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def uvicorn_config(app: App, listener: HttpListener) -> uvicorn.Config:
    # Each new connection starts as FirstBytes: HTTP/1.1 becomes uvicorn's httptools protocol, h2c goes to hypercorn.
    first_bytes = functools.partial(FirstBytes, h2c=H2cHandOff(app, functools.partial(hypercorn_config, listener)))
    return uvicorn.Config(
        app,
        host=listener.host,
        port=listener.port,
        loop="none",  # already running: the role's loop (SIE_EVENT_LOOP)
        http=first_bytes,  # type: ignore[arg-type]  # uvicorn calls it as it would a protocol class
        ws="wsproto",  # the status page's /ws/cluster-status
        lifespan="on",
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=max(1, round(listener.grace_s)),
        access_log=False,
        proxy_headers=False,
        log_config=None,
    )


async def _serve_uvicorn(app: App, listener: HttpListener, stop: asyncio.Event) -> None:
    server = _EmbeddedUvicorn(uvicorn_config(app, listener))
    serving = asyncio.ensure_future(server.serve())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        server.should_exit = True  # uvicorn checks it every 0.1 s, then closes and drains
        await serving


_SERVERS: dict[str, Callable[[App, HttpListener, asyncio.Event], Awaitable[Any]]] = {
    "hypercorn": _serve_hypercorn,
    "uvicorn": _serve_uvicorn,
}
