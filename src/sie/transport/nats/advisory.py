"""The max-deliveries advisory this transport publishes itself, in the loopback's shape (loopback/stream.py).

Why ours and not only the server's: JetStream keeps a message that reached max_deliver in a WorkQueue stream
(reference/dependencies.md §2), where it counts toward max_msgs until max_age. So a delivery NAKed on its
last allowed attempt is terminated instead (which removes it) and this advisory, carrying the work item,
takes the server's place on the same subject. The server still publishes its own advisory (without
`subject` or `item`) when the last attempt is never settled and ack_wait runs out; that message stays in
the stream for the dead-letter path to read with get_msg and delete.
"""

from __future__ import annotations

from typing import Any

from sie.catalog.names import MAX_DELIVERIES_ADVISORY
from sie.transport import base
from sie.wire import DecodeError, structure, unstructure
from sie.wire.queue import WorkItem

_ADVISORY_PREFIX = MAX_DELIVERIES_ADVISORY.removesuffix(">")


def max_deliver_advisory(
    stream: str, consumer: str, stream_seq: int, deliveries: int, subject: str, item: WorkItem | None
) -> dict[str, Any]:
    """The advisory as JSON-able data; `item` is None when the payload could not be decoded."""
    wire_item = unstructure(item) if item is not None else None
    return base.max_deliver_advisory(stream, consumer, stream_seq, deliveries, subject, wire_item)


def restore_item(subject: str, message: Any) -> Any:
    """A received advisory with its `item` back as a WorkItem, as the loopback hands it out; else `message`."""
    if not subject.startswith(_ADVISORY_PREFIX) or not isinstance(message, dict):
        return message
    item = message.get("item")
    if not isinstance(item, dict):
        return message
    try:
        return {**message, "item": structure(item, WorkItem)}
    except DecodeError:
        return message
