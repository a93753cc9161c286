"""One JetStream delivery behind the Delivery protocol: the settlement verbs of nats-py's Msg, settled exactly
once (a second settlement raises AlreadySettledError; `in_progress` may repeat until then).

A NAK of the last allowed delivery becomes a `term()` plus this transport's max-deliveries advisory
(advisory.py says why). Changes nothing but its own message's state on the broker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nats.aio.msg import Msg

from sie.transport.base import AlreadySettledError
from sie.transport.nats.errors import translated
from sie.wire.queue import WorkItem

if TYPE_CHECKING:
    from sie.transport.nats.consumer import LaneFetcher


class NatsDelivery:
    """A decoded work item and the message it came in; `num_delivered` is 1 on the first delivery."""

    __slots__ = ("item", "subject", "num_delivered", "stream_seq", "_msg", "_owner", "_settled_by")

    def __init__(self, owner: LaneFetcher, msg: Msg, item: WorkItem) -> None:
        metadata = msg.metadata
        self.item = item
        self.subject = msg.subject
        self.num_delivered = metadata.num_delivered
        self.stream_seq = metadata.sequence.stream
        self._msg = msg
        self._owner = owner
        self._settled_by = ""

    async def ack(self) -> None:
        """Done: JetStream removes the work item from the stream."""
        self._settle("ack")
        with translated("ack"):
            await self._msg.ack()

    async def nak(self, delay_s: float = 0.0) -> None:
        """Not done: redeliver after `delay_s`; on the last allowed delivery, terminate and advise instead."""
        self._settle("nak")
        if self._owner.is_last_delivery(self.num_delivered):
            await self._owner.dead_letter(self._msg, self.item)
            return
        with translated("nak"):
            await self._msg.nak(delay=delay_s if delay_s > 0 else None)

    async def in_progress(self) -> None:
        """Still working: JetStream restarts the ack-wait timer; may be called many times before settlement."""
        self._check_open("in_progress")
        with translated("in_progress"):
            await self._msg.in_progress()

    async def term(self) -> None:
        """Never redeliver: JetStream removes the work item from the stream."""
        self._settle("term")
        with translated("term"):
            await self._msg.term()

    def __repr__(self) -> str:
        return f"NatsDelivery({self.subject!r}, seq={self.stream_seq}, num_delivered={self.num_delivered})"

    def _settle(self, verb: str) -> None:
        self._check_open(verb)
        self._settled_by = verb

    def _check_open(self, verb: str) -> None:
        self._owner.connection.check(verb)
        if self._settled_by:
            raise AlreadySettledError(
                f"{verb} after {self._settled_by} on work item {self.item.work_item_id!r} "
                f"(delivery {self.num_delivered})"
            )
