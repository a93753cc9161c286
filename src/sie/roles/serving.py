"""Serve an ASGI app with hypercorn (HTTP/1.1 and h2c) until SIGTERM/SIGINT, then shut down gracefully:
refuse new requests, let in-flight ones finish up to the grace period, then stop the listener.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable

from hypercorn.asyncio import serve
from hypercorn.config import Config

logger = logging.getLogger(__name__)


def hypercorn_config(host: str, port: int, grace_s: float) -> Config:
    config = Config()
    config.bind = [f"{host}:{port}"]
    config.graceful_timeout = grace_s
    config.keep_alive_timeout = 120
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    return config


async def serve_until_signalled(app: Callable, config: Config, on_shutdown: Callable[[], Awaitable[None]]) -> None:
    """Run hypercorn; on SIGTERM or SIGINT await `on_shutdown()` (drain), then stop the server."""
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
        logger.info("listening on http://%s", config.bind[0])
        await serve(app, config, shutdown_trigger=stop.wait)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        if shutdown_task is not None:
            await shutdown_task
