"""One NATS connection and its lifecycle: connect (a few quick retries, then TransportUnavailable naming the
last connect error; the attempts themselves log nothing above debug, so a caller that retries in the background,
`sie.transport.reconnecting`, reports the outage once), reconnect forever once connected, drain on close. Every
other module asks it whether it is usable.

Owns the nats-py client object; it never publishes or subscribes by itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import nats
import nats.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.manager import JetStreamManager

from sie.settings.messaging import NatsSettings
from sie.transport.base import TransportUnavailable
from sie.transport.nats.errors import translate

logger = logging.getLogger(__name__)

# The initial connect tries this often (nats-py's reconnect loop, RECONNECT_WAIT_S apart) before the
# role fails to start; afterwards the client reconnects forever and the transport reports it unavailable.
INITIAL_CONNECT_ATTEMPTS = 3
CONNECT_TIMEOUT_S = 2.0
RECONNECT_WAIT_S = 0.5
DRAIN_TIMEOUT_S = 5.0
# JetStream API calls (stream/consumer info, create, update) answer within this or count as unavailable.
API_TIMEOUT_S = 5.0
# JetStream publishes awaiting their ACK at once on one connection (seed 000 §8.2 bounds the ACK set).
MAX_PENDING_ACKS = 4000


class Connection:
    """The connected nats-py client with its JetStream contexts; `check` raises once it is closed."""

    def __init__(self, client: Client, events: _Events) -> None:
        self.client = client
        self._events = events
        self.js: JetStreamContext = client.jetstream(timeout=API_TIMEOUT_S)
        self.jsm: JetStreamManager = client.jsm(timeout=API_TIMEOUT_S)
        self.closed = False

    @classmethod
    async def open(cls, settings: NatsSettings, name: str | None = None) -> Connection:
        """Connect to `settings.url` (comma-separated servers); TransportUnavailable when none answers."""
        if not settings.url:
            raise TransportUnavailable("no NATS server configured (set SIE_NATS_URL)")
        servers = [server.strip() for server in settings.url.split(",") if server.strip()]
        events = _Events()
        try:
            client = await nats.connect(
                servers=servers,
                user=settings.user,
                password=settings.password,
                name=name,
                connect_timeout=int(CONNECT_TIMEOUT_S),
                reconnect_time_wait=RECONNECT_WAIT_S,  # float seconds work; nats-py annotates int
                max_reconnect_attempts=INITIAL_CONNECT_ATTEMPTS - 1,
                drain_timeout=int(DRAIN_TIMEOUT_S),
                error_cb=events.on_error,
                disconnected_cb=events.on_disconnected,
                reconnected_cb=events.on_reconnected,
            )
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            reason = events.last_error if events.last_error is not None else translate(exc, "connect")
            raise TransportUnavailable(f"cannot connect to NATS at {settings.url}: {reason}") from exc
        finally:
            events.connecting = False
        # Bounded attempts were for the initial connect only; a running role rides out broker restarts.
        client.options["max_reconnect_attempts"] = -1
        return cls(client, events)

    def on_disconnect(self, listener: Callable[[], None]) -> None:
        """Call `listener()` whenever the connection drops (before nats-py starts reconnecting)."""
        self._events.listeners.append(listener)

    def on_reconnect(self, listener: Callable[[], None]) -> None:
        """Call `listener()` whenever the connection is back after a drop, its subscriptions sent again."""
        self._events.reconnect_listeners.append(listener)

    @property
    def is_closed(self) -> bool:
        """Whether the transport was closed or the connection is gone for good."""
        return self.closed or self.client.is_closed

    def check(self, action: str) -> None:
        """Raise TransportUnavailable when the transport was closed or the connection is gone for good."""
        if self.is_closed:
            raise TransportUnavailable(f"{action} on a closed NATS transport")

    def check_connected(self, action: str) -> None:
        """As `check`, and also while reconnecting: used where waiting for the broker would only add latency."""
        self.check(action)
        if not self.client.is_connected:
            raise TransportUnavailable(f"{action}: not connected to NATS (reconnecting)")

    async def close(self) -> None:
        """Drain subscriptions and buffered publishes, then close; a failing drain falls back to close."""
        self.closed = self._events.closing = True
        if self.client.is_closed:
            return
        if not self.client.is_connected:
            await self._close_client()  # nothing can be drained while reconnecting
            return
        try:
            await self.client.drain()
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            logger.warning("NATS drain failed, closing: %s", exc)
        if not self.client.is_closed:
            await self._close_client()

    async def _close_client(self) -> None:
        """nats-py's close. While it reconnects, its close cancels the reconnecting task, whose socket it then waits
        to see closed: that wait can end in a CancelledError that is not ours (the socket is closed all the same).
        Our own task's cancellation still propagates."""
        try:
            await self.client.close()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            logger.debug("NATS close: the socket's close was cancelled with the reconnect; it is closed")


class _Events:
    """nats-py's connection callbacks, logged; quiet about the disconnect our own close causes, and about the
    failures of the initial connect (its TransportUnavailable names the last one)."""

    def __init__(self) -> None:
        self.connecting = True
        self.closing = False
        self.last_error: Exception | None = None
        self.listeners: list[Callable[[], None]] = []
        self.reconnect_listeners: list[Callable[[], None]] = []

    async def on_error(self, exc: Exception) -> None:
        if self.connecting:
            self.last_error = exc
            logger.debug("NATS connect attempt failed: %s", exc)
        elif not self.closing:
            logger.warning("NATS connection error: %s", exc)

    async def on_disconnected(self) -> None:
        if not self.closing:
            logger.warning("disconnected from NATS; reconnecting")
        for listener in self.listeners:
            listener()

    async def on_reconnected(self) -> None:
        logger.info("reconnected to NATS")
        for listener in self.reconnect_listeners:
            listener()
