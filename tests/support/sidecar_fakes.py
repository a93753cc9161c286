"""A JetStream-like delivery that records its settlement calls, for the sidecar's unit tests (the
transport is the seam there; integration tests use the real loopback and NATS transports)."""

from __future__ import annotations

from sie.wire.queue import WorkItem

WORK_SUBJECT = "sie.work.default.default.default.m"


class RecordingDelivery:
    """Appends `("ack"|"nak"|"in_progress"|"term", work_item_id[, delay])` to `log`."""

    def __init__(self, item: WorkItem, log: list, subject: str = WORK_SUBJECT) -> None:
        self.item = item
        self.subject = subject
        self.num_delivered = 1
        self._log = log

    async def ack(self) -> None:
        self._log.append(("ack", self.item.work_item_id))

    async def nak(self, delay_s: float = 0.0) -> None:
        self._log.append(("nak", self.item.work_item_id, delay_s))

    async def in_progress(self) -> None:
        self._log.append(("in_progress", self.item.work_item_id))

    async def term(self) -> None:
        self._log.append(("term", self.item.work_item_id))
