"""Core NATS pub/sub behind the MessageBus protocol: WorkResults (or their result_chunk_v1 envelopes) as msgpack
on reply subjects, control messages (health, config deltas, cancels, advisories) as JSON. Fire and forget;
nothing is persisted.

A result subscription is ONE nats subscription; before decoding, it reads the request id from the raw bytes
(scan.peek_request_id) and lets `wants` drop results nobody waits for. Undecodable payloads are logged and
dropped; a raising handler is logged and never reaches nats-py or the other subscribers.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

import attrs
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from sie.transport.base import MessageHandler, ResultHandler, ResultMessage
from sie.transport.nats.connection import Connection
from sie.transport.nats.errors import translated
from sie.transport.nats.scan import peek_request_id
from sie.wire import DecodeError, dumps_json, from_json, loads_json, to_json, to_msgpack
from sie.wire.result_chunks import decode_inbox_message

logger = logging.getLogger(__name__)

FLUSH_TIMEOUT_S = 5.0

# Whether the gateway still waits for a request id; False drops the result before it is decoded.
WantsRequest = Callable[[str], bool]


class NatsSubscription:
    """One handler's nats subscription; `unsubscribe` stops delivery (a second call does nothing)."""

    __slots__ = ("subject", "dropped", "_subscription", "_connection")

    def __init__(self, connection: Connection, subject: str) -> None:
        self.subject = subject
        self.dropped = 0  # results skipped by the request-id scan, and undecodable payloads
        self._subscription: Subscription | None = None
        self._connection = connection

    def bind(self, subscription: Subscription) -> None:
        """Attach the nats subscription once the server has it."""
        self._subscription = subscription

    async def unsubscribe(self) -> None:
        """Stop delivering to the handler."""
        subscription, self._subscription = self._subscription, None
        if subscription is not None and not self._connection.client.is_closed:
            with translated(f"unsubscribe from {self.subject}"):
                await subscription.unsubscribe()


class NatsBus:
    """Publishes and subscribes on the shared connection; owns no state beyond its subscriptions' counters."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    @property
    def max_payload(self) -> int | None:
        """The server's max_payload, as it announced on connect."""
        return self._connection.client.max_payload

    async def publish_result(self, subject: str, result: ResultMessage) -> None:
        """Send one result or result chunk (msgpack) to a reply subject."""
        await self._publish("publish_result", subject, to_msgpack(result))

    async def subscribe_results(
        self, subject: str, handler: ResultHandler, *, wants: WantsRequest | None = None
    ) -> NatsSubscription:
        """Call `handler(result)` per result under `subject`; `wants(request_id)` False drops it undecoded."""
        subscription = NatsSubscription(self._connection, subject)

        async def on_message(msg: Msg) -> None:
            data = msg.data
            if wants is not None:
                request_id = peek_request_id(data)
                if request_id is not None and not wants(request_id):
                    subscription.dropped += 1
                    return
            try:
                result = decode_inbox_message(data)
            except DecodeError as exc:
                subscription.dropped += 1
                logger.warning("dropping an undecodable result on %s: %s", msg.subject, exc)
                return
            await _call(handler, (result,), msg.subject)

        return await self._subscribe(subscription, on_message)

    async def publish(self, subject: str, message: Any) -> None:
        """Send a control message as JSON: an attrs message through the wire converter, else plain data."""
        payload = to_json(message) if attrs.has(type(message)) else dumps_json(message)
        await self._publish("publish", subject, payload)

    async def subscribe(
        self, subject: str, handler: MessageHandler, message_type: type | None = None
    ) -> NatsSubscription:
        """Call `handler(subject, message)` with each JSON message decoded (into `message_type` when given)."""
        subscription = NatsSubscription(self._connection, subject)

        async def on_message(msg: Msg) -> None:
            try:
                message = _decode_control(msg, message_type)
            except DecodeError as exc:
                subscription.dropped += 1
                logger.warning("dropping an undecodable message on %s: %s", msg.subject, exc)
                return
            await _call(handler, (msg.subject, message), msg.subject)

        return await self._subscribe(subscription, on_message)

    async def flush(self) -> None:
        """Return once everything published so far has reached the broker."""
        self._connection.check_connected("flush")
        with translated("flush"):
            # nats-py 2.16 writes flush()'s PING straight to the socket, ahead of publishes still in its
            # pending buffer; by the first PONG its flusher has written them, so the second PING follows them.
            await self._connection.client.flush(timeout=FLUSH_TIMEOUT_S)
            await self._connection.client.flush(timeout=FLUSH_TIMEOUT_S)

    async def _publish(self, action: str, subject: str, payload: bytes) -> None:
        self._connection.check(action)
        with translated(f"{action} to {subject}"):
            await self._connection.client.publish(subject, payload)

    async def _subscribe(self, subscription: NatsSubscription, callback: Callable[[Msg], Any]) -> NatsSubscription:
        self._connection.check("subscribe")
        with translated(f"subscribe to {subscription.subject}"):
            subscription.bind(await self._connection.client.subscribe(subscription.subject, cb=callback))
        return subscription


def _decode_control(msg: Msg, message_type: type | None) -> Any:
    if message_type is not None:
        return from_json(msg.data, message_type)
    return loads_json(msg.data)


async def _call(handler: Callable[..., Any], args: tuple[Any, ...], subject: str) -> None:
    try:
        outcome = handler(*args)
        if inspect.isawaitable(outcome):
            await outcome
    except Exception:  # noqa: BLE001 - a subscriber's bug must not reach nats-py's delivery task or other subscribers
        logger.exception("bus handler failed on subject %r", subject)
