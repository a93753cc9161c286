"""Result collection: one app-wide subscription on `_INBOX.{router_id}.>` fills the slots of pending requests.

A request registers N slots under its request id and waits until all are filled or its timeout passes.
Results for unknown ids, out-of-range slots or already-filled slots are dropped (delivery is at-least-once).
A result too large for one broker message arrives as result_chunk_v1 envelopes, reassembled per request within
the gateway-wide chunk budget (result_chunks.py); an invalid transfer fails the request at once with the static
transport_failure. The entry leaves the table on completion, timeout, publish failure or client disconnect:
`expect` owns it, and on leaving releases its chunk reservations and runs its close hooks (payload cleanup).

Results travel on core NATS: one published while the gateway's connection was down is lost. So when the bus
reports a reconnect, each waiting request asks again (`resend_with`: its dispatcher republishes the items whose slots
are still empty, duplicates being dropped as above), and so does each generation no chunk has arrived for yet.

A request first sent to one worker's own stream (worker direct-dispatch, seed 000 §8.2) may have items published on
the lane as well once that worker went quiet; once the lane stored them (`fall_back`), only a result that did not
come from the worker's stream fills their slots.

A generation registers a ChunkStream instead (`open_stream`): its GenerateChunks come out in `seq` order from the
first attempt to deliver seq 0 (a reorder buffer; duplicates and other attempts' chunks are dropped) until the
`done` chunk. A failed WorkResult for it (the sidecar refused the item before the worker saw it) ends the stream
with that failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Final, Self

from sie.catalog.names import inbox_wildcard
from sie.gateway.assembly import check_failures
from sie.gateway.errors import GatewayError, GatewayTimeoutError, QueueUnavailableError, TransportFailureError
from sie.gateway.result_chunks import ChunkBudget, ChunkTransferError, ResultReassembly
from sie.transport.base import MessageBus, ResultMessage, Subscription
from sie.wire.generate import GenerateChunk
from sie.wire.queue import ResultChunkV1, WorkResult

logger = logging.getLogger(__name__)

# A generation's chunks held out of order, or not yet read, beyond this many end it: a broken or hostile peer.
MAX_BUFFERED_CHUNKS: Final = 16384
# Attempts whose seq 0 has not arrived yet, each holding its early chunks, are tracked up to this many.
MAX_CANDIDATE_ATTEMPTS: Final = 8


class PendingRequest:
    """The result slots of one request, in item order."""

    __slots__ = ("request_id", "results", "missing", "_done", "_budget", "_chunks", "_close_hooks", "_resend",
                 "_fallen_back")  # fmt: skip

    def __init__(
        self, request_id: str, size: int, done: asyncio.Future[None], budget: ChunkBudget | None = None
    ) -> None:
        self.request_id = request_id
        self.results: list[WorkResult | None] = [None] * size
        self.missing = size
        self._done = done
        self._budget = budget
        self._chunks: ResultReassembly | None = None  # made on the first chunk: most requests never get one
        self._close_hooks: list[Callable[[], None]] = []
        self._resend: Callable[[], None] | None = None
        self._fallen_back: set[int] | None = None  # made by the first `fall_back`: few requests ever need one

    def resend_with(self, resend: Callable[[], None]) -> None:
        """How to ask again for results that may have been lost: `resend()` publishes the items of the empty slots
        (`unanswered`, read when it publishes)."""
        self._resend = resend

    def resend(self) -> None:
        """Ask again for every result not received yet (after a reconnect); nothing once answered or failed."""
        if self._resend is not None and self.unanswered():
            self._resend()

    def unanswered(self) -> list[int]:
        """The indexes of the empty slots while the request still waits; [] once answered, failed or closed."""
        if not self.missing or self._done.done():
            return []
        return [index for index, result in enumerate(self.results) if result is None]

    def fall_back(self, indexes: Iterable[int]) -> None:
        """The items at `indexes`, first sent to one worker's own stream, are now stored on the lane too (the worker
        direct-dispatch fallback, seed 000 §8.2): from here on a result marked `direct_origin` no longer fills their
        slots, so a request is never completed partly by the worker and partly by the lane; any other fills them."""
        if self._fallen_back is None:
            self._fallen_back = set()
        self._fallen_back.update(indexes)

    def _superseded(self, result: WorkResult) -> bool:
        """A late answer from the worker an item fell back from (its slot waits for the lane's)."""
        return bool(result.direct_origin) and self._fallen_back is not None and result.item_index in self._fallen_back

    def fill(self, result: WorkResult) -> None:
        """Store a result in its slot; a duplicate, an out-of-range index or a late direct-origin result for an item
        that fell back to the lane is ignored."""
        index = result.item_index
        if not 0 <= index < len(self.results) or self.results[index] is not None:
            return
        if self._superseded(result):
            return
        self.results[index] = result
        self.missing -= 1
        if self._chunks is not None:
            self._chunks.forget(index)
        if self.missing == 0 and not self._done.done():
            self._done.set_result(None)

    def add_chunk(self, chunk: ResultChunkV1) -> None:
        """Take one result_chunk_v1 envelope; its item's slot is filled once the transfer is complete and
        verified. An invalid transfer fails the request with the static transport_failure."""
        index = chunk.item_index
        if self._done.done() or (0 <= index < len(self.results) and self.results[index] is not None):
            return  # answered already (a redelivery's chunks), or nobody waits
        if self._chunks is None:
            self._chunks = ResultReassembly(self.request_id, len(self.results), self._budget or ChunkBudget())
        try:
            result = self._chunks.add(chunk)
        except ChunkTransferError as exc:
            logger.warning("result chunks of %s failed: %s", self.request_id, exc)
            self.fail(TransportFailureError())
            return
        if result is None:
            return
        if self._superseded(result):
            self._chunks.reopen(index)  # the lane's answer for the item may still come in chunks
            return
        self.fill(result)

    def at_close(self, hook: Callable[[], None]) -> None:
        """Call `hook()` once nobody waits for the request any more, whatever its outcome."""
        self._close_hooks.append(hook)

    def fail(self, error: BaseException) -> None:
        """End the wait with `error` (the collector is stopping, or the work was never stored)."""
        if not self._done.done():
            self._done.set_exception(error)

    def close(self) -> None:
        """Nobody waits any more: later results and failures are ignored, chunk reservations are released and
        the close hooks run."""
        if not self._done.done():
            self._done.cancel()
        if self._chunks is not None:
            self._chunks.release()
        hooks, self._close_hooks = self._close_hooks, []
        for hook in hooks:
            hook()

    async def wait(self, timeout_s: float) -> list[WorkResult]:
        """Every slot's result; GatewayTimeoutError when they do not all arrive within `timeout_s`."""
        if self.missing:
            try:
                async with asyncio.timeout(timeout_s):
                    await self._done
            except TimeoutError:
                received = len(self.results) - self.missing
                raise GatewayTimeoutError(
                    f"No worker result within {timeout_s:g}s ({received} of {len(self.results)} items answered)"
                ) from None
        return self.results  # type: ignore[return-value]  # every slot is filled once missing == 0


class ChunkStream:
    """The ordered chunks of one generation: `next` yields them in `seq` order, once each, up to the `done` one."""

    __slots__ = ("request_id", "attempt_id", "finished", "_next_seq", "_held", "_candidates", "_ready", "_error",
                 "_wakeup", "_on_close", "_closed", "_resend")  # fmt: skip

    def __init__(self, request_id: str, on_close: Callable[[], None] | None = None) -> None:
        self.request_id = request_id
        self.attempt_id: str | None = None  # the attempt whose chunks are kept: the first to deliver seq 0
        self.finished = False  # the done chunk has been received (nothing more is wanted from the worker)
        self._next_seq = 0
        self._held: dict[int, GenerateChunk] = {}  # the kept attempt's chunks that arrived early
        self._candidates: dict[str, dict[int, GenerateChunk]] = {}  # attempts seen before any seq 0
        self._ready: deque[GenerateChunk] = deque()
        self._error: BaseException | None = None
        self._wakeup = asyncio.Event()
        self._on_close = on_close
        self._closed = False
        self._resend: Callable[[], None] | None = None

    def resend_with(self, resend: Callable[[], None]) -> None:
        """How to ask again for the generation (publish its item again) while none of its chunks has arrived."""
        self._resend = resend

    def resend(self) -> None:
        """After a reconnect: ask again when no chunk has arrived (none can be missing from the middle then; a
        stream already under way keeps its attempt, and a gap in it ends it by the request timeout)."""
        if self._resend is not None and self.wants_resend():
            self._resend()

    def wants_resend(self) -> bool:
        """Whether asking again still makes sense: no chunk has arrived, and the stream is neither closed nor
        failed."""
        untouched = self.attempt_id is None and not self._candidates
        return untouched and not self._closed and self._error is None

    def add(self, chunk: GenerateChunk) -> None:
        """Take one chunk as it arrived; it is released once every lower seq of its attempt has been."""
        if self._closed or self.finished or self._error is not None or chunk.seq < 0:
            return
        if self.attempt_id is None:
            if chunk.seq != 0:
                self._hold_candidate(chunk)
                return
            self.attempt_id = chunk.attempt_id
            self._held = self._candidates.pop(chunk.attempt_id, {})
            self._candidates.clear()
        elif chunk.attempt_id != self.attempt_id:
            return  # a redelivery's attempt, after another one won
        if chunk.seq < self._next_seq or chunk.seq in self._held:
            return  # a duplicate
        self._held[chunk.seq] = chunk
        self._release()

    def _hold_candidate(self, chunk: GenerateChunk) -> None:
        early = self._candidates.get(chunk.attempt_id)
        if early is None:
            if len(self._candidates) >= MAX_CANDIDATE_ATTEMPTS:
                return
            early = self._candidates[chunk.attempt_id] = {}
        if len(early) >= MAX_BUFFERED_CHUNKS:
            self.fail(TransportFailureError())
            return
        early.setdefault(chunk.seq, chunk)

    def _release(self) -> None:
        released = False
        while self._next_seq in self._held:
            chunk = self._held.pop(self._next_seq)
            self._ready.append(chunk)
            self._next_seq += 1
            released = True
            if chunk.done:
                self.finished = True
                self._held.clear()
                break
        if len(self._held) + len(self._ready) > MAX_BUFFERED_CHUNKS:
            logger.warning("generation %s: over %d chunks buffered", self.request_id, MAX_BUFFERED_CHUNKS)
            self.fail(TransportFailureError())
        elif released:
            self._wakeup.set()

    def fail(self, error: BaseException) -> None:
        """End the stream with `error` (raised by `next` once the chunks released before it are read)."""
        if self._error is None and not self.finished:
            self._error = error
            self._wakeup.set()

    async def next(self, timeout_s: float) -> GenerateChunk:
        """The next chunk in order; GatewayTimeoutError when none comes within `timeout_s`, or the failure that
        ended the stream. Call it no more after the `done` chunk."""
        while not self._ready:
            if self._error is not None:
                raise self._error
            self._wakeup.clear()
            try:
                async with asyncio.timeout(timeout_s):
                    await self._wakeup.wait()
            except TimeoutError:
                raise GatewayTimeoutError(f"No generated text within {timeout_s:g}s") from None
        return self._ready.popleft()

    def close(self) -> None:
        """Nobody reads any more: later chunks are ignored and the collector forgets the request."""
        if self._closed:
            return
        self._closed = True
        self._held.clear()
        self._candidates.clear()
        if self._on_close is not None:
            self._on_close()


class Collector:
    """The gateway's inbox: an async context manager holding the one result subscription."""

    def __init__(self, bus: MessageBus, router_id: str, chunk_budget: ChunkBudget | None = None) -> None:
        self._bus = bus
        self._subject = inbox_wildcard(router_id)
        self._pending: dict[str, PendingRequest] = {}
        self._streams: dict[str, ChunkStream] = {}
        self.chunk_budget = chunk_budget if chunk_budget is not None else ChunkBudget()
        self._subscription: Subscription | None = None

    async def __aenter__(self) -> Self:
        self._subscription = await self._bus.subscribe_results(self._subject, self._on_result)
        self._bus.on_reconnect(self._resend_waiting)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        subscription, self._subscription = self._subscription, None
        if subscription is not None:
            await subscription.unsubscribe()
        for pending in list(self._pending.values()):
            pending.fail(QueueUnavailableError("The gateway stopped before the results arrived"))
        for stream in list(self._streams.values()):
            stream.fail(QueueUnavailableError("The gateway stopped before the generation ended"))

    def __len__(self) -> int:
        """Requests waiting for results or chunks (tests check it returns to zero: no leaks)."""
        return len(self._pending) + len(self._streams)

    @contextlib.contextmanager
    def expect(self, request_id: str, size: int) -> Iterator[PendingRequest]:
        """Register `size` slots for `request_id` for the duration of the `with` block."""
        if self._subscription is None:
            raise QueueUnavailableError("The gateway's result subscription is not running")
        pending = PendingRequest(request_id, size, asyncio.get_running_loop().create_future(), self.chunk_budget)
        self._pending[request_id] = pending
        try:
            yield pending
        finally:
            del self._pending[request_id]
            pending.close()

    def open_stream(self, request_id: str) -> ChunkStream:
        """Register the chunk stream of one generation; it stays registered until its `close()`."""
        if self._subscription is None:
            raise QueueUnavailableError("The gateway's result subscription is not running")
        stream = ChunkStream(request_id, lambda: self._streams.pop(request_id, None))
        self._streams[request_id] = stream
        return stream

    def _resend_waiting(self) -> None:
        """The bus reconnected: results published meanwhile are lost, so every waiting request asks again."""
        if self._subscription is None or not (self._pending or self._streams):
            return
        logger.info(
            "reconnected to the broker: asking again for the results of %d requests and %d generations",
            len(self._pending),
            len(self._streams),
        )
        for pending in list(self._pending.values()):
            pending.resend()
        for stream in list(self._streams.values()):
            stream.resend()

    def _on_result(self, message: ResultMessage) -> None:
        if isinstance(message, GenerateChunk):
            stream = self._streams.get(message.request_id)
            if stream is not None:
                stream.add(message)
            return
        pending = self._pending.get(message.request_id)
        if pending is None:
            stream = self._streams.get(message.request_id)
            if stream is not None and isinstance(message, WorkResult) and not message.success:
                stream.fail(_refusal(message))
            return
        if isinstance(message, ResultChunkV1):
            pending.add_chunk(message)
        else:
            pending.fill(message)


def _refusal(result: WorkResult) -> Exception:
    """What a failed WorkResult for a generation means to its caller (the encode path's classification)."""
    try:
        check_failures([result], per_item=False)
    except GatewayError as exc:
        return exc
    return TransportFailureError()
