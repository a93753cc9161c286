"""JetStream publishes with their ACKs collected on one inbox subscription: the mechanism of nats-py's
publish_async without its flaw (in nats-py 2.16 an error ACK, such as 10077 stream full, raises inside the
reply handler and the publish's future never completes) and without a request, timer task and token per call.

`submit` returns a future that completes when the stream stored the message, or fails with our TransportError
(BackpressureError for a full stream, TransportUnavailable after ACK_TIMEOUT_S). Owns nothing but those futures.
"""

from __future__ import annotations

import asyncio
import itertools
import json

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from sie.transport.base import BackpressureError, TransportError, TransportUnavailable
from sie.transport.nats.connection import MAX_PENDING_ACKS, Connection
from sie.transport.nats.errors import translate, translated

# The aggregate ACK deadline of seed 000 §8.2: a publish not confirmed by then counts as a broker outage.
ACK_TIMEOUT_S = 6.0
_NO_RESPONDERS = "503"


class AckInbox:
    """Outstanding JetStream publishes of one connection, by reply token."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._prefix = connection.client.new_inbox()
        self._tokens = itertools.count()
        self._pending: dict[str, tuple[asyncio.Future[None], asyncio.TimerHandle]] = {}
        self._subscription: Subscription | None = None
        self._loop = asyncio.get_running_loop()

    async def start(self) -> None:
        """Subscribe the inbox the ACKs come back on."""
        with translated("subscribe to the ACK inbox"):
            self._subscription = await self._connection.client.subscribe(f"{self._prefix}.*", cb=self._on_ack)
        # An ACK still owed when the connection drops is lost with it: fail at once instead of at the deadline.
        self._connection.on_disconnect(lambda: self.fail_all("the NATS connection dropped before the ACK came"))

    async def submit(self, subject: str, payload: bytes) -> asyncio.Future[None]:
        """Publish to JetStream; the returned future completes with the stream's ACK."""
        if len(self._pending) >= MAX_PENDING_ACKS:
            raise BackpressureError(f"publish to {subject}: {MAX_PENDING_ACKS} JetStream publishes await their ACK")
        token = str(next(self._tokens))
        future = self._loop.create_future()
        self._pending[token] = (future, self._loop.call_later(ACK_TIMEOUT_S, self._expire, token))
        try:
            with translated(f"publish to {subject}"):
                await self._connection.client.publish(subject, payload, reply=f"{self._prefix}.{token}")
        except BaseException:
            self._forget(token)
            raise
        return future

    def fail_all(self, reason: str) -> None:
        """The connection is closing: every publish still waiting fails with TransportUnavailable."""
        for token in list(self._pending):
            future = self._forget(token)
            if future is not None and not future.done():
                future.set_exception(TransportUnavailable(reason))
                future.exception()  # nobody may be waiting any more; do not log it as never retrieved

    async def _on_ack(self, msg: Msg) -> None:
        future = self._forget(msg.subject[len(self._prefix) + 1 :])
        if future is None or future.done():
            return
        error = _ack_error(msg)
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)

    def _expire(self, token: str) -> None:
        future = self._forget(token)
        if future is not None and not future.done():
            future.set_exception(TransportUnavailable(f"JetStream did not ACK a publish within {ACK_TIMEOUT_S} s"))

    def _forget(self, token: str) -> asyncio.Future[None] | None:
        entry = self._pending.pop(token, None)
        if entry is None:
            return None
        entry[1].cancel()
        return entry[0]


def _ack_error(msg: Msg) -> TransportError | None:
    """None for a positive ACK, else our exception (chained to the nats-py one it stands for)."""
    cause: nats.errors.Error
    if msg.headers and msg.headers.get("Status") == _NO_RESPONDERS:
        cause = nats.js.errors.NoStreamResponseError()
    elif b'"error"' not in msg.data:
        return None
    else:
        try:
            nats.js.errors.APIError.from_error(json.loads(msg.data)["error"])  # it raises rather than returns
        except nats.js.errors.APIError as exc:
            cause = exc
        except (ValueError, KeyError, TypeError):
            return None  # an ACK we cannot read still names no error
    error = translate(cause, f"publish to {msg.subject}")
    error.__cause__ = cause
    return error
