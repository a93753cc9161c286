"""The gateway's one dispatch core (seed 000 §2, §8.2, §16.3): route a request to its lane, admit it, publish its
work items, and hand back what the workers answer — every result at once (`collect`: encode, score, extract) or a
stream of chunks (`stream`: generation). The inference and generation services are thin users of it: each adds its
own checks and builds its own work items; nothing below them publishes or waits on its own.

Worker direct-dispatch (seed 000 §8.2): a capped pool's work, and every generation, goes to one eligible worker's
own subject where workers are addressable (not in `--role all`). A refused direct publish goes on the lane at once;
a capped pool's work still unanswered after the fallback delay is published on the lane once more (a generation
under way cannot be duplicated, so it has no such delay), and once the lane stored it the worker's late answers are
ignored and the worker is told to drop what it still queues.

No web framework, no status codes: failures are the typed exceptions in errors.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable, Iterable
from typing import Any, Final

import attrs

from sie.catalog.names import work_worker_subject
from sie.gateway.collector import ChunkStream, Collector, PendingRequest
from sie.gateway.errors import GatewayError, GenerationFailedError, InvalidRequestError, WorkerRetryableError
from sie.gateway.metadata import ResponseMetadata, collect_metadata, model_revision
from sie.gateway.offload import PayloadOffload
from sie.gateway.pools import PoolDirectory
from sie.gateway.publisher import WorkPublisher, publish_error
from sie.gateway.router import LaneHints, Route, Router
from sie.gateway.workitems import Ticket
from sie.pools import PoolNotFoundError, canonical_pool_name
from sie.telemetry.requests import note_request
from sie.telemetry.tracing import TraceHeaders
from sie.wire import codes
from sie.wire.generate import FINISH_ERROR, GenerateChunk
from sie.wire.queue import WorkItem, WorkResult

# Seed 000 §2: a RESOURCE_EXHAUSTED terminal chunk's retry hint is honoured only as an integer in 1..60.
_RETRY_AFTER_RANGE: Final = range(1, 61)
_INPUT_ERROR_CODES: Final = frozenset({codes.INVALID_INPUT, codes.INPUT_TOO_LONG})
# Seed 000 §8.2 "short fallback delay": how long a request sent to one worker's own stream waits for that worker
# before its items still unanswered are published on the lane as well, once. Long enough for a worker that reads
# its stream to answer a small batch; short against the request timeout, so a worker whose stream nobody reads any
# more (it stopped, or lost its consumer) costs its requests this long instead of their whole timeout.
DIRECT_FALLBACK_DELAY_S: Final = 2.0


@attrs.frozen
class DirectTarget:
    """The worker a request's work goes to by worker direct-dispatch (seed 000 §8.2), and that worker's subject."""

    worker_id: str
    subject: str


@attrs.frozen
class Collected:
    """Every result of one request, in item order, with the route it took and its timings."""

    route: Route
    results: list[WorkResult]
    meta: ResponseMetadata


class Streamed:
    """One published request whose answer streams: `next()` gives its chunks in order until the done chunk;
    `close()` must follow, and announces the cancel when the worker may still be producing them."""

    def __init__(
        self, route: Route, request_id: str, chunks: ChunkStream, timeout_s: float, on_abandon: Callable[[str], None]
    ) -> None:
        self.route = route
        self.request_id = request_id
        self.publish_ms = 0.0
        self._chunks = chunks
        self._timeout_s = timeout_s
        self._on_abandon = on_abandon
        self._exits = contextlib.ExitStack()  # what the request holds while it runs (its lane's in-flight count)
        self._closed = False

    @property
    def attempt_id(self) -> str | None:
        return self._chunks.attempt_id

    async def next(self) -> GenerateChunk:
        """The next chunk; GatewayTimeoutError when none comes within the request timeout, the failure a worker's
        error chunk reports, or the failure that ended the stream."""
        chunk = await self._chunks.next(self._timeout_s)
        error = chunk_error(chunk)
        if error is not None:
            raise error
        return chunk

    def hold(self, held: contextlib.AbstractContextManager[Any]) -> None:
        """Keep `held` entered until the stream is closed."""
        self._exits.enter_context(held)

    def at_close(self, hook: Callable[[], None]) -> None:
        """Call `hook()` once the stream is closed (the deletion of an offloaded prompt)."""
        self._exits.callback(hook)

    def close(self) -> None:
        """Stop reading; if the done chunk never came, tell the worker to stop (best effort). Idempotent."""
        if self._closed:
            return
        self._closed = True
        finished = self._chunks.finished
        self._chunks.close()
        self._exits.close()
        if not finished:
            self._on_abandon(self.request_id)


@attrs.frozen
class Dispatcher:
    """Where requests go and how their answers come back: the router and the pools name the lane, the publisher
    admits and publishes, the collector gathers results, the payload offload moves large payloads through the
    store; `timeout_s` bounds each wait (SIE_GATEWAY_REQUEST_TIMEOUT), `direct_fallback_delay_s` the wait for a
    worker direct-dispatch target before the lane is asked too."""

    router: Router
    pools: PoolDirectory
    publisher: WorkPublisher
    collector: Collector
    timeout_s: float
    offload: PayloadOffload = attrs.field(factory=lambda: PayloadOffload(None, lambda: None))
    direct_fallback_delay_s: float = DIRECT_FALLBACK_DELAY_S

    async def route(self, spec: str, profile: Any, hints: LaneHints) -> Route:
        """The request's route; a pool it names must exist (seed 000 §16.3: missing named pools fail closed)."""
        requested = hints.requested_pool()
        if requested is None:
            return self.router.route(spec, profile, hints)
        target = await self.pools.target(requested)
        if target is None:
            raise PoolNotFoundError(f"pool '{canonical_pool_name(requested)}' not found")
        return self.router.route(spec, profile, hints, target)

    async def collect(
        self, route: Route, build: Callable[[Ticket], list[WorkItem]], trace: TraceHeaders | None
    ) -> Collected:
        """Publish the work items `build` makes for a new request on `route` and wait for every result."""
        ticket = self._ticket(trace)
        items = build(ticket)
        request_id = ticket.request_id
        target = await self._admit(route, request_id, len(items))
        with (
            self.collector.expect(request_id, len(items)) as pending,
            self.publisher.in_flight(route.lane, len(items)),
        ):
            items = await self.offload.prepare(items, pending.at_close)  # large payloads via the store
            started = time.perf_counter()
            fallback: asyncio.TimerHandle | None = None
            try:
                stored, fallback = await self._publish(route, items, target, pending)
                stored.add_done_callback(functools.partial(_fail_unless_stored, pending.fail, route.subject))
                pending.resend_with(
                    functools.partial(self._republish, route, lambda: [items[i] for i in pending.unanswered()])
                )
                published = time.perf_counter()
                results = await pending.wait(self.timeout_s)
            except BaseException:  # a timeout, a failed publish, the client gone (cancelled): nobody waits now
                self.publisher.abandon(request_id)
                raise
            finally:
                if fallback is not None:
                    fallback.cancel()
            waited = time.perf_counter()
        meta = collect_metadata(request_id, results, (published - started) * 1e3, (waited - published) * 1e3)
        meta.model_revision = model_revision(route.bundle_config_hash, results)
        return Collected(route, results, meta)

    async def stream(self, route: Route, build: Callable[[Ticket], WorkItem], trace: TraceHeaders | None) -> Streamed:
        """Publish the one work item `build` makes for a new request on `route`; the caller reads the chunks of the
        returned stream and closes it."""
        ticket = self._ticket(trace)
        item = build(ticket)
        target = await self._admit(route, ticket.request_id, 1, whole_lane=True)
        chunks = self.collector.open_stream(ticket.request_id)
        streamed = Streamed(route, ticket.request_id, chunks, self.timeout_s, self.publisher.cancel_generation)
        started = time.perf_counter()
        try:
            streamed.hold(self.publisher.in_flight(route.lane, 1))
            (item,) = await self.offload.prepare([item], streamed.at_close)  # a prompt too large: via the store
            # A generation under way cannot be duplicated safely: only a refused direct publish goes on the lane.
            direct = target.subject if target is not None else None
            stored = await self.publisher.publish(route.lane, route.subject, [item], direct)
            stored.add_done_callback(functools.partial(_fail_unless_stored, chunks.fail, route.subject))
            chunks.resend_with(
                functools.partial(self._republish, route, lambda: [item] if chunks.wants_resend() else [])
            )
        except BaseException:
            streamed.close()
            raise
        streamed.publish_ms = (time.perf_counter() - started) * 1e3
        return streamed

    async def _publish(
        self, route: Route, items: list[WorkItem], target: DirectTarget | None, pending: PendingRequest
    ) -> tuple[asyncio.Future[None], asyncio.TimerHandle | None]:
        """Publish a request's items on the route's lane, or by worker direct-dispatch on `target`'s subject (seed
        000 §8.2): if that worker's stream refuses them they go on the lane at once; if it stores them, a timer
        publishes on the lane those still unanswered after the fallback delay. The stored future, and the timer
        (None without one), which the caller cancels once nobody waits."""
        lane = route.lane
        if target is None:
            return await self.publisher.publish(lane, route.subject, items), None
        stored = await self.publisher.publish_direct(lane, target.subject, items)
        if stored is not None:
            later = self.direct_fallback_delay_s
            return stored, asyncio.get_running_loop().call_later(later, self._fall_back, route, items, pending, target)
        stored = await self.publisher.publish(lane, route.subject, items)
        indexes = range(len(items))
        stored.add_done_callback(functools.partial(self._fell_back_once_stored, pending, indexes, target))
        return stored, None

    def _fall_back(self, route: Route, items: list[WorkItem], pending: PendingRequest, target: DirectTarget) -> None:
        """The fallback delay passed: publish the items still unanswered on the lane (once)."""
        indexes = pending.unanswered()
        if indexes:
            confirmed = functools.partial(self._fell_back, pending, indexes, target)
            self.publisher.fall_back(route.subject, [items[index] for index in indexes], confirmed)

    def _fell_back_once_stored(
        self, pending: PendingRequest, indexes: Iterable[int], target: DirectTarget, stored: asyncio.Future[None]
    ) -> None:
        if not stored.cancelled() and stored.exception() is None:
            self._fell_back(pending, indexes, target)

    def _fell_back(self, pending: PendingRequest, indexes: Iterable[int], target: DirectTarget) -> None:
        """The lane stored the items at `indexes`: the target's late answers for them are ignored from now on, and
        the target drops them where they still wait on its stream (batch_cancel, only now: never a lost item)."""
        pending.fall_back(indexes)
        self.publisher.cancel_direct(target.worker_id, pending.request_id)

    def _republish(self, route: Route, wanted: Callable[[], list[WorkItem]]) -> None:
        """Publish again on the route's lane the items `wanted()` names (the work of a request whose results may have
        been lost while the broker connection was down: those still unanswered, until the stream stores them or
        nobody waits; the collector drops whatever arrives twice)."""
        self.publisher.republish(route.lane, route.subject, wanted)

    def _ticket(self, trace: TraceHeaders | None) -> Ticket:
        """A new request's name, reply subject and deadline (now + the request timeout)."""
        request_id, reply = self.publisher.new_request()
        note_request(request_id=request_id)
        now = time.time()
        return Ticket(request_id, reply, self.publisher.router_id, now, now + self.timeout_s, trace)

    async def _admit(self, route: Route, request_id: str, count: int, whole_lane: bool = False) -> DirectTarget | None:
        """Admit `count` items on the route's lane (PROVISIONING, backpressure); the worker the work goes to by
        worker direct-dispatch (seed 000 §8.2: one of a capped pool's assigned workers, or with `whole_lane`, a
        generation's, of any eligible worker of the lane), or None for the lane."""
        assigned = self.pools.assigned(route.admission_pool) if route.admission_pool else None
        await self.publisher.admit(route.lane, count, route.bundle_config_hash, assigned, route.demand_lanes)
        if assigned is None and not whole_lane:
            return None
        worker = self.publisher.direct_worker(route.lane, request_id, route.bundle_config_hash, assigned)
        if worker is None:
            return None
        lane = route.lane
        subject = work_worker_subject(lane.pool, lane.machine_profile, lane.bundle, route.model_id, worker)
        return DirectTarget(worker, subject)


def _fail_unless_stored(fail: Callable[[BaseException], None], subject: str, stored: asyncio.Future[None]) -> None:
    """End a request's wait (`fail`) with the refusal when the stream did not store its items (a detached ACK drain
    that failed; a request already answered or gone is not affected)."""
    if stored.cancelled():
        return
    error = stored.exception()
    if error is not None:
        fail(publish_error(error, subject))


def chunk_error(chunk: GenerateChunk) -> GatewayError | None:
    """The failure a terminal chunk reports, or None for a chunk that is not one."""
    if chunk.error_code is None and chunk.finish_reason != FINISH_ERROR:
        return None
    code = chunk.error_code or codes.INFERENCE_ERROR
    message = chunk.error or f"Generation failed ({code})"
    if code in _INPUT_ERROR_CODES:
        return InvalidRequestError(message, code=code)
    if code in codes.RETRYABLE_WORKER_CODES:
        hint = chunk.retry_after_s
        valid = code == codes.RESOURCE_EXHAUSTED and type(hint) is int and hint in _RETRY_AFTER_RANGE
        return WorkerRetryableError(message, code=code, retry_after_s=hint if valid else None)
    return GenerationFailedError(message, code=code)
