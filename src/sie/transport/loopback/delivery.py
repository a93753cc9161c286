"""One loopback delivery: the settlement verbs of nats.py's Msg, forwarded to the pool stream that owns the message.

A delivery settles once (ack, nak or term); `in_progress` may repeat until then. It changes no stream state itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sie.transport.base import AlreadySettledError, TransportUnavailable

if TYPE_CHECKING:
    from sie.transport.loopback.lane import StoredMessage
    from sie.transport.loopback.stream import PoolStream


class LoopbackDelivery:
    """A work item handed to one fetcher; `num_delivered` is 1 on the first delivery."""

    __slots__ = ("item", "subject", "num_delivered", "_stream", "_message", "_settled_by")

    def __init__(self, stream: PoolStream, message: StoredMessage) -> None:
        self.item = message.item
        self.subject = message.subject
        self.num_delivered = message.deliveries
        self._stream = stream
        self._message = message
        self._settled_by = ""

    async def ack(self) -> None:
        """Done: remove the work item from the stream."""
        self._settle("ack")
        self._stream.remove(self._message)

    async def nak(self, delay_s: float = 0.0) -> None:
        """Not done: redeliver after `delay_s` (counts toward max_deliver)."""
        self._settle("nak")
        self._stream.nak(self._message, self, delay_s)

    async def in_progress(self) -> None:
        """Still working: restart the ack-wait timer; may be called many times before settlement."""
        self._check_open("in_progress")
        self._stream.extend(self._message, self)

    async def term(self) -> None:
        """Never redeliver this work item."""
        self._settle("term")
        self._stream.remove(self._message)

    def __repr__(self) -> str:
        return f"LoopbackDelivery({self.subject!r}, seq={self._message.seq}, num_delivered={self.num_delivered})"

    def _settle(self, verb: str) -> None:
        self._check_open(verb)
        self._settled_by = verb

    def _check_open(self, verb: str) -> None:
        if self._stream.closed:
            raise TransportUnavailable(f"{verb} on a closed loopback transport")
        if self._settled_by:
            item_id = self.item.work_item_id
            raise AlreadySettledError(
                f"{verb} after {self._settled_by} on work item {item_id!r} (delivery {self.num_delivered})"
            )
