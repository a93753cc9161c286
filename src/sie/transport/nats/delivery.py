"""One JetStream delivery behind the Delivery protocol: the settlement verbs of nats-py's Msg, under the
settle-exactly-once rule of transport/delivery.py.

A NAK of the last allowed delivery is a NAK like any other: JetStream then keeps the message, publishes its
max-deliveries advisory, and the gateway's dead letters take it (seed 000 §8). Changes nothing but its own
message's state on the broker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nats.aio.msg import Msg

from sie.transport.delivery import BaseDelivery
from sie.transport.nats.errors import translated
from sie.wire.queue import WorkItem

if TYPE_CHECKING:
    from sie.transport.nats.connection import Connection


class NatsDelivery(BaseDelivery):
    """A decoded work item and the message it came in; `num_delivered` is 1 on the first delivery."""

    __slots__ = ("stream_seq", "_msg", "_connection")

    transport_name = "NATS"

    def __init__(self, connection: Connection, msg: Msg, item: WorkItem) -> None:
        metadata = msg.metadata
        BaseDelivery.__init__(self, item, msg.subject, metadata.num_delivered)
        self.stream_seq = metadata.sequence.stream
        self._msg = msg
        self._connection = connection  # the fetcher's: settling needs it open

    def __repr__(self) -> str:
        return f"NatsDelivery({self.subject!r}, seq={self.stream_seq}, num_delivered={self.num_delivered})"

    def _closed(self) -> bool:
        return self._connection.is_closed

    async def _ack(self) -> None:
        with translated("ack"):
            await self._msg.ack()

    async def _nak(self, delay_s: float) -> None:
        with translated("nak"):
            await self._msg.nak(delay=delay_s if delay_s > 0 else None)

    async def _in_progress(self) -> None:
        with translated("in_progress"):
            await self._msg.in_progress()
