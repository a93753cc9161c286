"""The `DEAD_LETTERS` stream behind the DeadLetterStore protocol (seed 000 §8).

JetStream keeps a work message that used its last delivery in its WorkQueue stream and advises it by stream
sequence. `capture` reads it there (get_msg), stores its payload unchanged on `sie.dlq.{model_token}` with the
headers below and a deterministic `Nats-Msg-Id` (so gateway replicas acting on the same advisory store it once),
then deletes it from the work stream, where it would count toward max_msgs until max_age. A letter's id is its
sequence in `DEAD_LETTERS`. The stream is created on first use (Limits retention, 24 h max_age, storage and
replicas as SIE_STREAM_STORAGE / SIE_STREAM_REPLICAS) and reconciled like the work streams, never its storage.

An advisory is core NATS: sent while no gateway ran, it is heard by nobody and its message stays in the work stream
until max_age. `stranded` finds such messages: a consumer with nothing awaiting an ACK or a redelivery
(`num_ack_pending` 0; a NAKed message waiting out its delay counts there) has delivered every message of its filter
up to `delivered.stream_seq`, so one still in the WorkQueue stream (an acknowledged one is removed) at or below it
will never be delivered again: it is spent. (The ack floor is no guide: it moves past spent messages.)
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from typing import Final

import nats.js.errors
from nats.js import api

from sie.catalog.names import DEAD_LETTER_PREFIX, DEAD_LETTER_STREAM, WORK_SUBJECT_PREFIX, dead_letter_subject
from sie.settings import StreamSettings
from sie.transport.base import DeadLetter, MaxDeliveriesAdvisory, TransportError, TransportUnavailable
from sie.transport.nats.cache import FOREVER, TtlCache
from sie.transport.nats.connection import Connection
from sie.transport.nats.errors import translated
from sie.transport.nats.streams import reconciled
from sie.wire import DecodeError, from_msgpack
from sie.wire.queue import WorkItem

logger = logging.getLogger(__name__)

DEAD_LETTER_MAX_AGE_S: Final = 24 * 3600.0
DEAD_LETTER_SUBJECTS: Final = f"{DEAD_LETTER_PREFIX}.>"

MSG_ID_HEADER: Final = "Nats-Msg-Id"
# What a letter carries besides the original payload: where the work was queued and how it died.
SUBJECT_HEADER: Final = "Sie-Dlq-Subject"
STREAM_HEADER: Final = "Sie-Dlq-Stream"
STREAM_SEQ_HEADER: Final = "Sie-Dlq-Stream-Seq"
CONSUMER_HEADER: Final = "Sie-Dlq-Consumer"
DELIVERIES_HEADER: Final = "Sie-Dlq-Deliveries"
DEAD_AT_HEADER: Final = "Sie-Dlq-Dead-At"
PUBLISHED_AT_HEADER: Final = "Sie-Dlq-Published-At"

# The streams work is queued on: a pool's lanes and a worker's direct-dispatch subject.
WORK_STREAM_PREFIXES: Final = ("WORK_POOL_", "WORK_WORKER_")
_STREAM_NAME_IN_USE: Final = 10058
_SEQUENCE_NOT_FOUND: Final = 10043  # delete_msg of a sequence that is gone answers 400, not 404

# The live connection for an action; raises TransportUnavailable when the transport is not open.
ConnectionFor = Callable[[str], Connection]


def dead_letter_stream_config(settings: StreamSettings) -> api.StreamConfig:
    """The configuration `DEAD_LETTERS` is created with."""
    try:
        storage = api.StorageType(settings.storage)
    except ValueError:
        raise ValueError(
            f"stream storage must be 'memory' or 'file', got {settings.storage!r} (SIE_STREAM_STORAGE)"
        ) from None
    return api.StreamConfig(
        name=DEAD_LETTER_STREAM,
        subjects=[DEAD_LETTER_SUBJECTS],
        retention=api.RetentionPolicy.LIMITS,
        storage=storage,
        num_replicas=settings.replicas,
        max_age=DEAD_LETTER_MAX_AGE_S,
        discard=api.DiscardPolicy.OLD,
    )


def dead_letter_msg_id(stream: str, stream_seq: int, published_at: datetime.datetime | None) -> str:
    """The `Nats-Msg-Id` of the letter for message `stream_seq` of `stream`: the same on every gateway, and
    different for a later message that reuses the sequence of a recreated stream (its publish time differs)."""
    if published_at is None:
        return f"{stream}.{stream_seq}"
    micros = (published_at - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)) // datetime.timedelta(microseconds=1)
    return f"{stream}.{stream_seq}.{micros}"


def letter_headers(
    advisory: MaxDeliveriesAdvisory, subject: str, published_at: datetime.datetime | None
) -> dict[str, str]:
    """The headers a letter is stored with."""
    return {
        MSG_ID_HEADER: dead_letter_msg_id(advisory.stream, advisory.stream_seq, published_at),
        SUBJECT_HEADER: subject,
        STREAM_HEADER: advisory.stream,
        STREAM_SEQ_HEADER: str(advisory.stream_seq),
        CONSUMER_HEADER: advisory.consumer,
        DELIVERIES_HEADER: str(advisory.deliveries),
        DEAD_AT_HEADER: advisory.timestamp or _rfc3339(datetime.datetime.now(datetime.UTC)),
        PUBLISHED_AT_HEADER: _rfc3339(published_at) if published_at is not None else "",
    }


def letter_from(raw: api.RawStreamMsg) -> DeadLetter:
    """A stored letter read back; headers it lacks read as empty (a message someone else put on `sie.dlq.>`)."""
    headers = raw.headers or {}
    return DeadLetter(
        letter_id=raw.seq or 0,
        subject=headers.get(SUBJECT_HEADER, ""),
        stream=headers.get(STREAM_HEADER, ""),
        stream_seq=_whole(headers.get(STREAM_SEQ_HEADER)),
        consumer=headers.get(CONSUMER_HEADER, ""),
        deliveries=_whole(headers.get(DELIVERIES_HEADER)),
        dead_at=headers.get(DEAD_AT_HEADER, ""),
        published_at=headers.get(PUBLISHED_AT_HEADER, ""),
        item=_work_item(raw.data),
    )


class NatsDeadLetterStore:
    """Dead letters in `DEAD_LETTERS` on the connection `connection_for` gives; ensures the stream once."""

    def __init__(self, connection_for: ConnectionFor, settings: StreamSettings) -> None:
        self._connection_for = connection_for
        self._settings = settings
        self._ensured: TtlCache[str, None] = TtlCache(FOREVER)

    async def stranded(self, limit: int, min_age_s: float) -> list[MaxDeliveriesAdvisory]:
        """Spent work messages of every work stream whose advisory nobody captured (see the module docstring)."""
        connection = self._connected("look for spent work")
        queued_before = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=min_age_s)
        found: list[MaxDeliveriesAdvisory] = []
        with translated("look for spent work"):
            streams = await connection.jsm.streams_info()
            for stream in streams:
                name = stream.config.name or ""
                if not name.startswith(WORK_STREAM_PREFIXES) or not stream.state.messages:
                    continue
                first = stream.state.first_seq or 1
                for consumer in await connection.jsm.consumers_info(name):
                    found += await _spent(connection, name, first, consumer, limit - len(found), queued_before)
                    if len(found) >= limit:
                        return found
        return found

    async def capture(self, advisory: MaxDeliveriesAdvisory) -> DeadLetter | None:
        """Move the advised work message into `DEAD_LETTERS`; None when it is gone, not work, or already stored."""
        connection = self._connected("capture a dead letter")
        original = await _get(connection, advisory.stream, advisory.stream_seq)
        if original is None or not (original.subject or "").startswith(f"{WORK_SUBJECT_PREFIX}."):
            return None  # moved by another gateway, acked or aged out meanwhile, or not a stream of ours
        subject = original.subject or ""
        headers = letter_headers(advisory, subject, original.time)
        await self._ensured.get(DEAD_LETTER_STREAM, lambda: self._ensure_stream(connection))
        try:
            with translated(f"store the dead letter of {subject}"):
                ack = await connection.js.publish(
                    dead_letter_subject(subject), original.data or b"", stream=DEAD_LETTER_STREAM, headers=headers
                )
        except TransportError:
            self._ensured.forget(DEAD_LETTER_STREAM)  # deleted behind our back, perhaps: ensure it next time
            raise
        await _delete(connection, advisory.stream, advisory.stream_seq)
        if ack.duplicate:
            return None  # another gateway stored it first
        return DeadLetter(
            letter_id=ack.seq,
            subject=subject,
            stream=advisory.stream,
            stream_seq=advisory.stream_seq,
            consumer=advisory.consumer,
            deliveries=advisory.deliveries,
            dead_at=headers[DEAD_AT_HEADER],
            published_at=headers[PUBLISHED_AT_HEADER],
            item=_work_item(original.data),
        )

    async def letters(self, after: int, limit: int) -> list[DeadLetter]:
        """Up to `limit` letters with ids above `after`, oldest first (one get_msg each)."""
        connection = self._connected("list dead letters")
        found: list[DeadLetter] = []
        seq = max(after, 0) + 1
        while len(found) < limit:
            with translated("read dead letters"):
                try:
                    raw = await connection.jsm.get_msg(DEAD_LETTER_STREAM, seq, subject=DEAD_LETTER_SUBJECTS, next=True)
                except nats.js.errors.NotFoundError:
                    break  # no letter after `seq`, or no stream yet
            found.append(letter_from(raw))
            seq = (raw.seq or seq) + 1
        return found

    async def get(self, letter_id: int) -> DeadLetter | None:
        """One letter; None when there is none with that id."""
        if letter_id < 1:
            return None
        raw = await _get(self._connected("read a dead letter"), DEAD_LETTER_STREAM, letter_id)
        return letter_from(raw) if raw is not None else None

    async def delete(self, letter_id: int) -> bool:
        """Remove one letter; False when there was none."""
        if letter_id < 1:
            return False
        return await _delete(self._connected("delete a dead letter"), DEAD_LETTER_STREAM, letter_id)

    async def purge(self) -> int:
        """Remove every letter stored so far; returns how many there were."""
        connection = self._connected("purge dead letters")
        with translated("purge dead letters"):
            try:
                state = (await connection.jsm.stream_info(DEAD_LETTER_STREAM)).state
            except nats.js.errors.NotFoundError:
                return 0
            # Up to the last letter seen: one stored meanwhile was not counted, so it stays.
            await connection.jsm.purge_stream(DEAD_LETTER_STREAM, seq=state.last_seq + 1)
        return state.messages

    def _connected(self, action: str) -> Connection:
        connection = self._connection_for(action)
        connection.check_connected(action)
        return connection

    async def _ensure_stream(self, connection: Connection) -> None:
        wanted = dead_letter_stream_config(self._settings)
        with translated(f"ensure stream {DEAD_LETTER_STREAM}"):
            try:
                await connection.jsm.add_stream(wanted)
                return
            except nats.js.errors.BadRequestError as exc:
                if exc.err_code != _STREAM_NAME_IN_USE:
                    raise
            info = await connection.jsm.stream_info(DEAD_LETTER_STREAM)
        update = reconciled(info.config, wanted)
        if update is None:
            return
        try:
            with translated(f"reconcile stream {DEAD_LETTER_STREAM}"):
                await connection.jsm.update_stream(update)
        except TransportUnavailable:
            raise
        except TransportError as exc:
            # It keeps working as it is (say R3 asked of a single server): the letters matter more than its shape.
            logger.warning("stream %s left as it is: %s", DEAD_LETTER_STREAM, exc)


async def _spent(  # noqa: PLR0913 - one consumer's scan: where, whose, how many, how old
    connection: Connection,
    stream: str,
    first_seq: int,
    consumer: api.ConsumerInfo,
    limit: int,
    queued_before: datetime.datetime,
) -> list[MaxDeliveriesAdvisory]:
    """Up to `limit` spent messages of `consumer`'s filter in `stream` (from `first_seq`) queued before
    `queued_before`; none while it has anything in flight."""
    config = consumer.config
    delivered = consumer.delivered
    if consumer.num_ack_pending or delivered is None or not config.durable_name:
        return []
    subject = config.filter_subject or ">"
    spent: list[MaxDeliveriesAdvisory] = []
    seq = first_seq
    while len(spent) < limit and seq <= (delivered.stream_seq or 0):
        try:
            raw = await connection.jsm.get_msg(stream, seq, subject=subject, next=True)
        except nats.js.errors.NotFoundError:
            break  # nothing of the filter left above `seq`
        if raw.seq is None or raw.seq > (delivered.stream_seq or 0):
            break  # not delivered yet: pending work, not spent
        if raw.time is not None and raw.time > queued_before:
            break  # this one and the later ones are young: their advisories may still be on their way
        deliveries = config.max_deliver if config.max_deliver and config.max_deliver > 0 else 0
        spent.append(
            MaxDeliveriesAdvisory(
                stream=stream, consumer=config.durable_name, stream_seq=raw.seq, deliveries=deliveries
            )
        )
        seq = raw.seq + 1
    return spent


async def _get(connection: Connection, stream: str, seq: int) -> api.RawStreamMsg | None:
    with translated(f"read message {seq} of {stream}"):
        try:
            return await connection.jsm.get_msg(stream, seq)
        except nats.js.errors.NotFoundError:
            return None


async def _delete(connection: Connection, stream: str, seq: int) -> bool:
    with translated(f"delete message {seq} of {stream}"):
        try:
            return bool(await connection.jsm.delete_msg(stream, seq))
        except nats.js.errors.NotFoundError:
            return False
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code != _SEQUENCE_NOT_FOUND:
                raise
            return False


def _work_item(data: bytes | None) -> WorkItem | None:
    try:
        return from_msgpack(data or b"", WorkItem)
    except DecodeError:
        return None


def _whole(text: str | None) -> int:
    return int(text) if text is not None and text.isdigit() else 0


def _rfc3339(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).isoformat()
