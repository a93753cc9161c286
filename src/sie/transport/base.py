"""The Transport protocol every role talks to instead of NATS: JetStream-like work queues per pool
with lane-filtered consumers, and core pub/sub for results, health, config deltas and cancels.

Semantics (seed 000 §8, DESIGN.md §4) every implementation keeps: at-least-once delivery; a delivery
is settled exactly once by ack / nak(delay), and `in_progress` may be called any number of
times before that; an unsettled delivery is redelivered after `ack_wait_s`; after `max_deliver`
deliveries it is not delivered again; a full pool stream (`max_msgs`) rejects new work (discard new).
Messages are typed objects: the loopback passes them by reference, NATS encodes them at its edge.

    TransportError
    ├── TransportUnavailable   no usable broker connection (gateway answers 503)
    ├── BackpressureError      the pool stream is full or over its pending limit (503, Retry-After: 5)
    ├── NoConsumerError        no consumer serves the lane (503 PROVISIONING)
    └── AlreadySettledError    a delivery was settled twice (a bug in the caller)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs

from sie.catalog.names import work_subject_pool
from sie.pools import KeyValue
from sie.wire.generate import GenerateChunk
from sie.wire.queue import ResultChunkV1, WorkItem, WorkResult

# The ACKs of one request's published items are awaited together, for at most this long (seed 000 §8.2).
ACK_DRAIN_TIMEOUT_S = 6.0


class TransportError(Exception):
    """Base class of transport failures."""


class TransportUnavailable(TransportError):
    """The broker cannot be reached or the transport is closed."""


class BackpressureError(TransportError):
    """The pool stream rejected the publish: it holds `max_msgs`, or pending work is over the limit."""


class NoConsumerError(TransportError):
    """No consumer is attached to the lane the work was published for."""


class AlreadySettledError(TransportError, RuntimeError):
    """ack/nak/in_progress after the delivery was already settled."""


@attrs.frozen
class Lane:
    """One physical queue lane: a pool stream filtered to one machine profile and bundle."""

    pool: str
    machine_profile: str
    bundle: str


@attrs.frozen
class LaneDepth:
    """The work a lane's durable consumer holds: not yet delivered (`pending`) and delivered but not yet
    acknowledged (`ack_pending`); both 0 while its stream or consumer does not exist."""

    pending: int = 0
    ack_pending: int = 0


class Delivery(Protocol):
    """One delivered work item and its settlement verbs (nats.py Msg semantics).

    A delivery that was already redelivered may still ack its message (by stream sequence, as JetStream
    does); its nak and in_progress then do nothing."""

    item: WorkItem
    subject: str
    num_delivered: int

    async def ack(self) -> None:
        """Done: remove the work item from the stream."""

    async def nak(self, delay_s: float = 0.0) -> None:
        """Not done: redeliver after `delay_s` (counts toward max_deliver)."""

    async def in_progress(self) -> None:
        """Still working: restart the ack-wait timer; may be called many times."""


class LaneConsumer(Protocol):
    """A durable consumer of one lane; several processes may pull from the same lane."""

    async def fetch(self, max_items: int, timeout_s: float) -> list[Delivery]:
        """Up to `max_items` deliveries; waits at most `timeout_s` for the first one, returns [] on timeout."""


# What arrives on a reply subject: a whole result, one result_chunk_v1 envelope of a result too large for one
# broker message (only a broker transport carries those; sie.wire.result_chunks), or one chunk of a streamed
# generation (sie.wire.generate).
ResultMessage = WorkResult | ResultChunkV1 | GenerateChunk
ResultHandler = Callable[[ResultMessage], Awaitable[None] | None]
MessageHandler = Callable[[str, Any], Awaitable[None] | None]


class Subscription(Protocol):
    async def unsubscribe(self) -> None:
        """Stop delivering to the handler."""


class WorkQueue(Protocol):
    """JetStream-like work queues: one stream per pool, one durable consumer per lane."""

    async def publish_work(self, subject: str, item: WorkItem) -> None:
        """Queue one work item on its lane subject; returns once the stream has accepted it.

        Work for a lane without a consumer stays queued (WorkQueue retention): callers check
        `has_consumer` first. Raises BackpressureError (stream full), TransportUnavailable,
        NoConsumerError for a worker subject (`work_worker_subject`) whose worker has no direct-dispatch
        stream, or TransportError for any other subject no stream captures."""

    async def submit_work_batch(self, subject: str, items: Sequence[WorkItem]) -> asyncio.Future[None]:
        """Send one request's items on one subject without waiting for the stream to store them (seed 000 §8.2:
        the request path does not wait for JetStream's ACKs). Returns once sent; the future completes when every
        item is stored, within ACK_DRAIN_TIMEOUT_S, or fails as publish_work would raise (TransportUnavailable
        when the ACKs do not come in time). A refusal known while sending raises here."""

    async def consumer(self, lane: Lane) -> LaneConsumer:
        """Attach to (creating if needed) the durable consumer of `lane`."""

    async def worker_consumer(self, lane: Lane, worker_id: str) -> LaneConsumer | None:
        """Attach to (creating if needed) worker `worker_id`'s direct-dispatch consumer on `lane` (seed 000 §8.2:
        stream `WORK_WORKER_{worker}` capturing `sie.work.{pool}.{mp}.{bundle}.*.{worker}`, durable `gen-{worker}`,
        configured as the lane's); None where there is no direct dispatch (in process: one sidecar, so a publish
        on a worker subject raises NoConsumerError and the gateway publishes on the lane instead).

        A publish on the worker subject of a worker whose stream does not exist raises NoConsumerError."""

    async def pending(self, pool: str) -> int:
        """Work items queued or in flight on a pool's stream (for backpressure)."""

    async def has_consumer(self, lane: Lane) -> bool:
        """Whether any consumer is attached to the lane (else the gateway answers PROVISIONING)."""

    async def lane_depth(self, lane: Lane) -> LaneDepth:
        """What the lane's consumer holds now (one broker round trip: for a periodic refresh, not per request)."""


class MessageBus(Protocol):
    """Core pub/sub: fire and forget, no persistence (results, health, config deltas, cancels)."""

    @property
    def max_payload(self) -> int | None:
        """The largest message, in bytes, the broker accepts on this connection (known once connected); None
        where messages pass by reference (the loopback), so nothing needs chunking or offloading."""

    async def publish_result(self, subject: str, result: ResultMessage) -> None:
        """Send one result (or result chunk) to a reply subject (core pub/sub, fire and forget)."""

    async def subscribe_results(self, subject: str, handler: ResultHandler) -> Subscription:
        """Receive results published under `subject` (a wildcard such as `_INBOX.gw-1.>`)."""

    async def publish(self, subject: str, message: Any) -> None:
        """Core pub/sub for control messages (health, config deltas, cancels): an attrs message from
        `sie.wire` or plain JSON-able data. On a broker they travel as JSON (low rate, human-readable)."""

    async def subscribe(self, subject: str, handler: MessageHandler, message_type: type | None = None) -> Subscription:
        """Receive control messages; `handler(subject, message)`. With `message_type` a broker
        transport decodes into that wire type (bad payloads are logged and dropped); the loopback
        passes the published object itself."""

    async def flush(self) -> None:
        """Return once everything published so far has reached the broker."""

    def on_reconnect(self, listener: Callable[[], None]) -> None:
        """Call `listener()` each time the broker connection is back after a drop, its subscriptions in place again.
        Core messages published to this process while it was away are lost (results among them), so a listener
        asks again for what it still waits for. A transport that cannot drop (the loopback) never calls it."""


@attrs.frozen(kw_only=True)
class WorkerStream:
    """A worker's direct-dispatch stream `WORK_WORKER_{worker}` as the broker lists it: what the sweep of the streams
    of workers that are gone decides on, and what tells the stream apart from one created again under its name."""

    name: str
    messages: int
    max_age_s: float  # the stream's own max_age; 0 when it keeps messages forever
    active_at: float  # epoch seconds (the broker's clock) of its last message, or of its creation if it never had one
    last_seq: int
    created: str  # RFC 3339, as the broker wrote it


class WorkerStreams(Protocol):
    """The workers' direct-dispatch streams, as far as a gateway sweeps those of workers that are gone."""

    async def worker_streams(self) -> list[WorkerStream]:
        """Every `WORK_WORKER_*` stream on the broker; [] where there is no direct dispatch (in process)."""

    async def delete_worker_stream(self, stream: WorkerStream) -> bool:
        """Delete `stream` (and its consumer) if it is still as listed: empty, no message published to it since and
        not created again. False when it is gone (another gateway swept it) or changed meanwhile."""


class Transport(WorkQueue, MessageBus, WorkerStreams, Protocol):
    """Both halves, as one broker connection provides them, the dead letters kept beside the work streams, and the
    workers' direct-dispatch streams; implementations are async context managers."""

    def dead_letters(self) -> DeadLetterStore:
        """Where this transport keeps work that used every delivery (`DEAD_LETTERS` on a broker)."""


@runtime_checkable
class KeyValueBuckets(Protocol):
    """A transport that also keeps key-value buckets (NATS: JetStream KV), where gateways share their pools."""

    def key_value(self, bucket: str) -> KeyValue:
        """The bucket named `bucket`, opened (or created) on first use."""


def pool_of(subject: str) -> str:
    """The pool whose stream captures a work subject; TransportError for any other subject."""
    pool = work_subject_pool(subject)
    if pool is None:
        raise TransportError(f"no stream captures subject {subject!r}")
    return pool


# Dead letters (seed 000 §8): JetStream keeps a message that used its last delivery in its WorkQueue stream and
# says so on `$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.{consumer}`; the gateway moves it from there
# into the dead letters (`DEAD_LETTERS`, subjects `sie.dlq.{model_token}`), where operators list and replay it.

MAX_DELIVER_ADVISORY_TYPE = "io.nats.jetstream.advisory.v1.max_deliver"


@attrs.frozen(kw_only=True)
class MaxDeliveriesAdvisory:
    """JetStream's max-deliveries advisory, as the server sends it (both transports publish this shape): the
    message `stream_seq` of `stream` was delivered `deliveries` times to `consumer` and stays in the stream."""

    stream: str
    consumer: str
    stream_seq: int
    deliveries: int
    type: str = MAX_DELIVER_ADVISORY_TYPE
    id: str = ""
    timestamp: str = ""  # RFC 3339, UTC


@attrs.frozen(kw_only=True)
class DeadLetter:
    """One work item that used every delivery, as the dead letters keep it: enough to show and replay it."""

    letter_id: int  # its sequence among the dead letters; what show, replay and delete name
    subject: str  # the work subject it was queued on, where a replay sends it again
    stream: str  # the work stream it died in
    stream_seq: int  # its sequence there
    consumer: str  # the lane consumer that delivered it
    deliveries: int
    dead_at: str  # RFC 3339 UTC: when it used its last delivery
    published_at: str  # RFC 3339 UTC: when it was queued
    item: WorkItem | None  # None when the payload is not a work item (it can be shown and deleted, not replayed)


class DeadLetterStore(Protocol):
    """Where dead letters are kept: `DEAD_LETTERS` on a broker, bounded memory in process."""

    async def stranded(self, limit: int, min_age_s: float) -> list[MaxDeliveriesAdvisory]:
        """Up to `limit` work messages that used every delivery but are still in their work stream, because no
        gateway heard their advisory (none ran when it was sent): the advisories they would have had, for `capture`.
        Only messages queued at least `min_age_s` ago (a younger one's advisory may still be on its way), and only
        of lanes with nothing in flight: elsewhere a message waiting for its redelivery cannot be told from a spent
        one."""

    async def capture(self, advisory: MaxDeliveriesAdvisory) -> DeadLetter | None:
        """Move the message an advisory names from its work stream into the dead letters. Returns the new
        letter; None when there was nothing to move (another gateway moved it first, or it is not work)."""

    async def letters(self, after: int, limit: int) -> list[DeadLetter]:
        """Up to `limit` letters with ids above `after`, oldest first."""

    async def get(self, letter_id: int) -> DeadLetter | None:
        """One letter; None when there is none with that id."""

    async def delete(self, letter_id: int) -> bool:
        """Remove one letter; False when there was none."""

    async def purge(self) -> int:
        """Remove every letter; returns how many there were."""
