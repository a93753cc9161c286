"""The loopback LaneConsumer: event-driven fetch from one lane of a pool stream (no polling).

Holds no state of its own; every `consumer(lane)` call returns one of these over the same durable LaneQueue.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sie.transport.base import Delivery, TransportUnavailable

if TYPE_CHECKING:
    from sie.transport.loopback.lane import LaneQueue
    from sie.transport.loopback.stream import PoolStream


class LoopbackLaneConsumer:
    """One fetcher handle on a lane's durable consumer; several handles split the lane's work."""

    def __init__(self, stream: PoolStream, lane: LaneQueue) -> None:
        self._stream = stream
        self._lane = lane

    async def fetch(self, max_items: int, timeout_s: float) -> list[Delivery]:
        """Up to `max_items` deliveries; waits at most `timeout_s` for the first one, returns [] on timeout."""
        if max_items < 1:
            raise ValueError(f"max_items must be at least 1, got {max_items}")
        self._check_open()
        deliveries = self._stream.deliver(self._lane, max_items)
        if deliveries or timeout_s <= 0:
            return deliveries
        deadline = self._stream.loop.time() + timeout_s
        # Another fetcher may take the message that woke us; then wait again until the same deadline.
        while await self._lane.wait(deadline):
            self._check_open()
            deliveries = self._stream.deliver(self._lane, max_items)
            if deliveries:
                return deliveries
        return []

    def _check_open(self) -> None:
        if self._stream.closed:
            raise TransportUnavailable("fetch on a closed loopback transport")
