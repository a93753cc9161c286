"""Local ingest (seed 001 "Local Ingest"): an owner-only Unix socket on which a co-located producer sends work items
straight into this sidecar's pipeline, without HTTP or the broker. `LocalIngest` is a third work source: its
`fetch` hands out deliveries made from the frames received, so the consumer stage admits, gates, prepares, batches,
dispatches and settles them exactly as it does the lane's. Results come back over the submit's connection through
`LocalResultBus`, never through the broker and never chunked. The frames are `sie.sidecar.local_protocol`'s; the
socket file and each connection's bounded writer are `sie.sidecar.local_socket`'s.

Settlement of a local delivery: `ack` ends it (an item acked without a result, dropped as abandoned, is answered with
an error result instead of nothing); `nak(delay)` hands it out again after the delay, counting deliveries up to
SIE_MAX_DELIVER, then answers it RESOURCE_EXHAUSTED; `in_progress` does nothing (no ack-wait runs here). The
items of a client that left are dropped wherever they are: skipped at fetch, their results discarded.

Bounds per connection: SIE_LOCAL_INGEST_MAX_INFLIGHT_ITEMS unanswered items (a submit past them is refused
QUEUE_FULL); RETAINED_FRAMES frames' worth of retained request bytes, taken from the declared length before the body
is read, so reading stops while they are out; a writer holding at most one frame per in-flight item and
OUTBOX_FRAMES frames' worth of bytes, each write done within WRITE_TIMEOUT_S, or the client is disconnected. At most
SIE_LOCAL_INGEST_MAX_CONNECTIONS connections.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

import attrs

from sie.catalog.names import INBOX_PREFIX, work_subject
from sie.settings import Settings
from sie.sidecar.local_protocol import (
    CONNECTION_ID,
    HEADER,
    Addressing,
    Budget,
    ProtocolError,
    SubmitRefused,
    error_frame,
    frame_length,
    hello_frame,
    read_submit,
    result_frame,
    submit_items,
)
from sie.sidecar.local_socket import (
    WRITE_TIMEOUT_S,
    FrameWriter,
    bind_owner_only,
    claim_socket_path,
    close_writer,
    remove_socket_file,
)
from sie.sidecar.results import error_result, payload_too_large_result
from sie.telemetry.sidecar import LocalConnection, LocalRefusal, SidecarMetrics
from sie.transport.base import Delivery, Lane, MessageBus, MessageHandler, ResultHandler, ResultMessage, Subscription
from sie.transport.delivery import BaseDelivery
from sie.wire import EncodeError, codes
from sie.wire.queue import WorkItem, WorkResult

logger = logging.getLogger(__name__)

DEFAULT_MAX_FRAME_BYTES: Final = 16 * 1024 * 1024
RETAINED_FRAMES: Final = 4
OUTBOX_FRAMES: Final = 4
# Writer room beyond one result frame per in-flight item: the hello and the errors of refused submits.
CONTROL_FRAMES: Final = 16
BACKLOG: Final = 64
# Turns of the event loop exit waits at most for accepted connections to reach their callback (asyncio takes 3).
EXIT_TURNS: Final = 16
EXHAUSTED_RETRY_AFTER_S: Final = 1


@attrs.frozen
class LocalIngestConfig:
    """Where the socket is, its bounds, and the deliveries an item gets (the stream's max_deliver)."""

    socket_path: Path
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_inflight_items: int = 1024
    max_connections: int = 16
    max_deliver: int = 20
    write_timeout_s: float = WRITE_TIMEOUT_S

    @classmethod
    def from_settings(cls, settings: Settings) -> LocalIngestConfig | None:
        """The socket SIE_LOCAL_INGEST_SOCKET names; None when it is unset (local ingest off)."""
        sidecar = settings.sidecar
        if sidecar.local_ingest_socket is None:
            return None
        return cls(
            sidecar.local_ingest_socket, sidecar.local_ingest_max_frame_bytes,
            sidecar.local_ingest_max_inflight_items, sidecar.local_ingest_max_connections, settings.stream.max_deliver,
        )  # fmt: skip


class _Submit:
    """One submit in flight: its id, its items not yet answered, the request bytes it retains."""

    __slots__ = ("frame_bytes", "id", "remaining")

    def __init__(self, submit_id: str, remaining: int, frame_bytes: int) -> None:
        self.id = submit_id
        self.remaining = remaining
        self.frame_bytes = frame_bytes


class _Entry:
    """One submitted item until it is answered or dropped; `subject` is the lane work subject it travels as."""

    __slots__ = ("connection", "done", "index", "item", "subject", "submit", "timer")

    def __init__(self, connection: _Connection, submit: _Submit, index: int, item: WorkItem, subject: str) -> None:
        self.connection = connection
        self.submit = submit
        self.index = index
        self.item = item
        self.subject = subject
        self.done = False
        self.timer: asyncio.TimerHandle | None = None  # a NAKed item's redelivery


class LocalDelivery(BaseDelivery):
    """One delivery of a local item; its verbs settle through the ingest (settle once, as every delivery)."""

    __slots__ = ("_ingest", "entry")

    transport_name = "local ingest"

    def __init__(self, ingest: LocalIngest, entry: _Entry, num_delivered: int) -> None:
        BaseDelivery.__init__(self, entry.item, entry.subject, num_delivered)
        self._ingest = ingest
        self.entry = entry

    def _closed(self) -> bool:
        return False  # an item whose connection is gone is done: its verbs do nothing

    async def _ack(self) -> None:
        self._ingest.settle(self.entry)

    async def _nak(self, delay_s: float) -> None:
        self._ingest.redeliver(self.entry, self.num_delivered, delay_s)

    async def _in_progress(self) -> None:
        return None


class _Connection:
    """One producer's connection: its budgets, its submits and items in flight, and the writer of its frames."""

    def __init__(self, number: int, reader: asyncio.StreamReader, out: FrameWriter, config: LocalIngestConfig) -> None:
        self.number = number
        self.reader = reader
        self.out = out
        self.inflight = Budget(config.max_inflight_items)
        self.retained = Budget(RETAINED_FRAMES * config.max_frame_bytes)
        self.submits: dict[str, _Submit] = {}
        self.entries: set[_Entry] = set()


class LocalIngest:
    """The local-ingest server of one lane: `async with` listens on the socket, leaving answers what is still
    unanswered SHUTTING_DOWN, closes every connection and removes the socket file. A `LaneConsumer`."""

    def __init__(
        self, config: LocalIngestConfig, lane: Lane, worker_id: str, metrics: SidecarMetrics | None = None
    ) -> None:
        self.config = config
        self.lane = lane
        self.worker_id = worker_id
        self._metrics = metrics
        # Reply subjects nobody can guess: a result published on the broker can never reach a local client.
        self.router_id = f"sie-local-{secrets.token_hex(8)}"
        self._reply_root = f"{INBOX_PREFIX}.{self.router_id}."
        self._waiting: dict[str, _Entry] = {}  # by reply subject: every item not yet answered nor dropped
        # Deliveries to hand out; bounded by the items in flight (dropped ones are purged when their client leaves).
        self._ready: collections.deque[LocalDelivery] = collections.deque()
        self._arrived: asyncio.Event | None = None
        self._live: set[_Connection] = set()
        self._tasks: set[asyncio.Task[None]] = set()  # serving one connection each
        self._handlers: set[asyncio.Task[Any]] = set()  # asyncio's connection callbacks, each awaiting its task
        self._starting = 0  # connections accepted whose callback has not run yet
        self._numbers = itertools.count(1)  # of connections
        self._submit_numbers = itertools.count(1)
        self._server: asyncio.Server | None = None
        self._inode: int | None = None
        self._closing = False

    async def __aenter__(self) -> Self:
        self._arrived = asyncio.Event()
        path = self.config.socket_path
        await asyncio.to_thread(claim_socket_path, path)
        sock, self._inode = bind_owner_only(path)
        try:
            self._server = await asyncio.get_running_loop().create_unix_server(
                self._new_protocol, sock=sock, backlog=BACKLOG
            )
        except BaseException:
            sock.close()
            self._remove_socket_file()
            raise
        logger.info("local ingest for %s listening on %s", self.lane, path)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._closing = True
        if self._server is not None:
            self._stop_accepting(self._server)
        for connection in list(self._live):
            for entry in list(connection.entries):
                message = "The sidecar is shutting down; send the item again"
                self._finish(entry, error_result(entry.item, codes.SHUTTING_DOWN, message, self.worker_id))
        # asyncio takes an accepted connection to its callback over a few turns of the loop (the protocol, the
        # transport, connection_made, the callback's task): yield until every connection accepted before the
        # listener stopped has reached its callback (which refuses it: closing), cancelling the serving tasks as
        # they come. At least two turns, the first for accepts already queued in this one. Bounded: a connection
        # whose transport failed never reaches its callback.
        for turn in range(EXIT_TURNS):
            await asyncio.sleep(0)
            for task in list(self._tasks):
                task.cancel()
            if turn > 0 and self._starting == 0:
                break
        await asyncio.gather(*self._tasks, *self._handlers, return_exceptions=True)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        self._remove_socket_file()

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._live)

    @property
    def unanswered(self) -> int:
        """Items received and neither answered nor dropped yet."""
        return len(self._waiting)

    # --- the work source -----------------------------------------------------------------------

    async def fetch(self, max_items: int, timeout_s: float) -> list[Delivery]:
        """Up to `max_items` deliveries; waits at most `timeout_s` for the first one, returns [] on timeout."""
        if self._arrived is None:
            raise RuntimeError("LocalIngest.fetch before the ingest was entered; this is a bug")
        if not self._ready:
            self._arrived.clear()
            try:
                async with asyncio.timeout(timeout_s):
                    await self._arrived.wait()
            except TimeoutError:
                return []
        deliveries: list[Delivery] = []
        while self._ready and len(deliveries) < max_items:
            delivery = self._ready.popleft()
            if not delivery.entry.done:
                deliveries.append(delivery)
        return deliveries

    # --- results and settlement ------------------------------------------------------------------

    def owns(self, reply_subject: str) -> bool:
        """Whether a reply subject is a local item's (its result goes back over the socket, not the broker)."""
        return reply_subject.startswith(self._reply_root)

    def answer(self, reply_subject: str, result: ResultMessage) -> None:
        """Send a local item's result to its client; nothing when the item was answered already or its client left."""
        entry = self._waiting.get(reply_subject)
        if entry is None:
            return
        if not isinstance(result, WorkResult):  # chunks are a broker's; generations are refused at submit
            logger.warning("local-ingest item %s got a %s; this is a bug", entry.item.work_item_id, type(result))
            return
        self._finish(entry, result)

    def settle(self, entry: _Entry) -> None:
        """ACK: the item is done; one acked without a result (abandoned) is answered with an error instead."""
        if entry.done:
            return
        deadline = entry.item.deadline
        if deadline is not None and deadline <= time.time():
            code, message = codes.GATEWAY_TIMEOUT, "The item's deadline passed before it was served"
        else:
            code, message = codes.INTERNAL_ERROR, "The item was dropped without a result (cancelled)"
        self._finish(entry, error_result(entry.item, code, message, self.worker_id))

    def redeliver(self, entry: _Entry, delivered: int, delay_s: float) -> None:
        """NAK: hand the item out again after `delay_s`, or answer it once it used every delivery."""
        if entry.done:
            return
        if 0 < self.config.max_deliver <= delivered:
            message = (f"The item was given back {delivered} times (SIE_MAX_DELIVER) without being served; "
                       "retry later")  # fmt: skip
            result = error_result(entry.item, codes.RESOURCE_EXHAUSTED, message, self.worker_id,
                                  retry_after_s=EXHAUSTED_RETRY_AFTER_S)  # fmt: skip
            self._finish(entry, result)
        elif delay_s <= 0:
            self._requeue(entry, delivered + 1)
        else:
            entry.timer = asyncio.get_running_loop().call_later(delay_s, self._requeue, entry, delivered + 1)

    def results_bus(self, bus: MessageBus) -> LocalResultBus:
        """`bus` with this ingest's results taken off it."""
        return LocalResultBus(bus, self)

    def _requeue(self, entry: _Entry, delivery: int) -> None:
        entry.timer = None
        if entry.done or self._arrived is None:
            return
        self._ready.append(LocalDelivery(self, entry, delivery))
        self._arrived.set()

    def _finish(self, entry: _Entry, result: WorkResult) -> None:
        """Answer one item and give back what it held."""
        self._forget(entry)
        connection = entry.connection
        connection.out.send(self._result_frame(entry, result))
        connection.inflight.give(1)
        submit = entry.submit
        submit.remaining -= 1
        if submit.remaining == 0:
            connection.submits.pop(submit.id, None)
            connection.retained.give(submit.frame_bytes)

    def _forget(self, entry: _Entry) -> None:
        entry.done = True
        if entry.timer is not None:
            entry.timer.cancel()
            entry.timer = None
        self._waiting.pop(entry.item.reply_subject, None)
        entry.connection.entries.discard(entry)

    def _result_frame(self, entry: _Entry, result: WorkResult) -> bytes:
        """The result's frame; a result over the frame limit becomes a compact PAYLOAD_TOO_LARGE (seed 001)."""
        submit_id, limit = entry.submit.id, self.config.max_frame_bytes
        try:
            frame = result_frame(submit_id, entry.index, result)
        except EncodeError:
            logger.exception("the result of local-ingest item %s cannot be encoded", entry.item.work_item_id)
            message = "The item's result could not be encoded; the failure is logged"
            return result_frame(submit_id, entry.index, error_result(entry.item, codes.INTERNAL_ERROR, message,
                                                                     self.worker_id))  # fmt: skip
        size = len(frame) - HEADER.size
        if size <= limit:
            return frame
        logger.warning("result of local-ingest item %s is %d bytes, over the %d-byte frame limit",
                       entry.item.work_item_id, size, limit)  # fmt: skip
        message = f"The result is {size} bytes, more than a {limit}-byte local-ingest frame carries"
        too_large = attrs.evolve(payload_too_large_result(result, size, limit), error=message)
        return result_frame(submit_id, entry.index, too_large)

    # --- connections -----------------------------------------------------------------------------

    @staticmethod
    def _stop_accepting(server: asyncio.Server) -> None:
        """Accept no more connections, the server left open. Closing it now would lose connections accepted but
        still on their way to the callback: asyncio's selector loop makes their transport after the close, which
        refuses it, and drops the socket unclosed. On that loop the listening socket is a reader of the loop;
        uvloop (whose accepts make their transport at once) has no such reader, and this does nothing there."""
        loop = asyncio.get_running_loop()
        for listening in server.sockets:
            loop.remove_reader(listening.fileno())

    def _new_protocol(self) -> asyncio.StreamReaderProtocol:
        """The stream protocol of one accepted connection; it counts as starting until its callback runs."""
        self._starting += 1
        return asyncio.StreamReaderProtocol(asyncio.StreamReader(), self._on_connect)

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._starting -= 1
        handler = asyncio.current_task()
        if handler is not None:
            self._handlers.add(handler)
        # Our own task per connection, so exit can cancel it (asyncio's stream callback task must not be cancelled).
        task = asyncio.get_running_loop().create_task(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        try:
            await asyncio.wait({task})
        finally:
            if not writer.is_closing():  # its task was cancelled before it ran: nothing served, nothing to flush
                writer.transport.abort()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
            self._handlers.discard(handler)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closing or len(self._live) >= self.config.max_connections:
            self._count(LocalConnection.REFUSED)
            if self._closing:
                refusal = error_frame(CONNECTION_ID, codes.SHUTTING_DOWN, "the sidecar is shutting down; connect again")
            else:
                message = f"the socket serves at most {self.config.max_connections} connections at once"
                refusal = error_frame(CONNECTION_ID, codes.QUEUE_FULL, message)
            writer.write(refusal)
            await close_writer(writer)
            return
        out = FrameWriter(writer, self.config.max_inflight_items + CONTROL_FRAMES,
                          OUTBOX_FRAMES * self.config.max_frame_bytes, self.config.write_timeout_s)  # fmt: skip
        connection = _Connection(next(self._numbers), reader, out, self.config)
        self._live.add(connection)
        self._count(LocalConnection.ACCEPTED)
        hello = hello_frame(self.lane, self.worker_id, self.config.max_frame_bytes, self.config.max_inflight_items)
        connection.out.send(hello)
        try:
            await self._read(connection)
        except ProtocolError as exc:
            logger.info("local-ingest client %d broke the protocol (%s); closing it", connection.number, exc)
            self._count(LocalConnection.PROTOCOL_ERROR)
            connection.out.send(error_frame(CONNECTION_ID, exc.code, exc.message))
        except OSError as exc:
            logger.info("local-ingest client %d left: %s", connection.number, exc)
        except Exception:  # noqa: BLE001 - a bug in one connection must not reach asyncio's callback unlogged
            logger.exception("local-ingest connection %d failed", connection.number)
        finally:
            self._drop(connection)
            if connection.out.slow:
                self._count(LocalConnection.SLOW_READER)
            try:
                await connection.out.close()
            finally:  # counted as open until its socket is closed
                self._live.discard(connection)

    async def _read(self, connection: _Connection) -> None:
        """Read frames until the client leaves; the declared bytes are taken before each body is read."""
        reader = connection.reader
        while connection.out.open:
            try:
                header = await reader.readexactly(HEADER.size)
                length = frame_length(header, self.config.max_frame_bytes)
                await connection.retained.take(length)  # stops reading while the connection retains its budget
                body = await reader.readexactly(length)
            except asyncio.IncompleteReadError:
                return  # the client left (or was disconnected), mid-frame or between frames
            if not self._on_frame(connection, body, length):
                connection.retained.give(length)

    def _on_frame(self, connection: _Connection, body: bytes, length: int) -> bool:
        """Admit one submit, or answer why not; True when its items now retain its bytes."""
        submit = read_submit(body)
        if submit.id in connection.submits:  # its results could not be told apart: the connection ends
            raise ProtocolError(codes.INVALID_INPUT, f"submit id {submit.id!r} is already in flight")
        addressing = Addressing(self.router_id, f"{self._reply_root}{connection.number}.{next(self._submit_numbers)}")
        try:
            items = submit_items(submit, self.lane, self.config.max_inflight_items, addressing)
        except SubmitRefused as exc:
            count = len(submit.items) if isinstance(submit.items, list) else 1
            self._refuse(connection, exc, LocalRefusal.INVALID_INPUT, count)
            return False
        if not connection.inflight.try_take(len(items)):
            message = (f"{len(items)} more items would put the connection over its {connection.inflight.limit} in "
                       "flight; send them once results arrive")  # fmt: skip
            refusal = SubmitRefused(submit.id, codes.QUEUE_FULL, message)
            self._refuse(connection, refusal, LocalRefusal.QUEUE_FULL, len(items))
            return False
        record = _Submit(submit.id, len(items), length)
        connection.submits[submit.id] = record
        lane = self.lane
        for index, item in enumerate(items):
            subject = work_subject(lane.pool, lane.machine_profile, lane.bundle, item.model_id)
            entry = _Entry(connection, record, index, item, subject)
            connection.entries.add(entry)
            self._waiting[item.reply_subject] = entry
            self._ready.append(LocalDelivery(self, entry, 1))
        if self._arrived is not None:
            self._arrived.set()
        return True

    def _refuse(self, connection: _Connection, refusal: SubmitRefused, reason: LocalRefusal, items: int) -> None:
        connection.out.send(error_frame(refusal.submit_id, refusal.code, refusal.message))
        if self._metrics is not None:
            self._metrics.local_refused(reason, items)

    def _drop(self, connection: _Connection) -> None:
        """Forget the items of a client that left: nobody can be answered; what waits to be fetched goes now."""
        if not connection.entries:
            return
        for entry in list(connection.entries):
            self._forget(entry)
        self._ready = collections.deque(delivery for delivery in self._ready if not delivery.entry.done)

    def _count(self, outcome: LocalConnection) -> None:
        if self._metrics is not None:
            self._metrics.local_connection(outcome)

    def _remove_socket_file(self) -> None:
        remove_socket_file(self.config.socket_path, self._inode)


class LocalResultBus:
    """The sidecar's bus with local-ingest results taken off it: a result on a local item's reply subject goes to
    its connection; everything else, and every other verb, goes to `bus`."""

    def __init__(self, bus: MessageBus, ingest: LocalIngest) -> None:
        self._bus = bus
        self._ingest = ingest

    @property
    def max_payload(self) -> int | None:
        return self._bus.max_payload

    async def publish_result(self, subject: str, result: ResultMessage) -> None:
        if self._ingest.owns(subject):
            self._ingest.answer(subject, result)
            return
        await self._bus.publish_result(subject, result)

    async def subscribe_results(self, subject: str, handler: ResultHandler) -> Subscription:
        return await self._bus.subscribe_results(subject, handler)

    async def publish(self, subject: str, message: Any) -> None:
        await self._bus.publish(subject, message)

    async def subscribe(self, subject: str, handler: MessageHandler, message_type: type | None = None) -> Subscription:
        return await self._bus.subscribe(subject, handler, message_type)

    async def flush(self) -> None:
        await self._bus.flush()

    def on_reconnect(self, listener: Callable[[], None]) -> None:
        self._bus.on_reconnect(listener)


__all__ = ["LocalDelivery", "LocalIngest", "LocalIngestConfig", "LocalResultBus"]
