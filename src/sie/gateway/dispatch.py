"""The gateway's one dispatch core (seed 000 §2, §8.2, §16.3): route a request to its lane, admit it, publish its
work items, and hand back what the workers answer — every result at once (`collect`: encode, score, extract) or a
stream of chunks (`stream`: generation). The inference and generation services are thin users of it: each adds its
own checks and builds its own work items; nothing below them publishes or waits on its own.
No web framework, no status codes: failures are the typed exceptions in errors.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable
from typing import Any, Final

import attrs

from sie.catalog.names import work_worker_subject
from sie.gateway.collector import ChunkStream, Collector
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
    store; `timeout_s` bounds each wait (SIE_GATEWAY_REQUEST_TIMEOUT)."""

    router: Router
    pools: PoolDirectory
    publisher: WorkPublisher
    collector: Collector
    timeout_s: float
    offload: PayloadOffload = attrs.field(factory=lambda: PayloadOffload(None, lambda: None))

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
        direct = await self._admit(route, request_id, len(items))
        with (
            self.collector.expect(request_id, len(items)) as pending,
            self.publisher.in_flight(route.lane, len(items)),
        ):
            items = await self.offload.prepare(items, pending.at_close)  # large payloads via the store
            started = time.perf_counter()
            try:
                stored = await self.publisher.publish(route.lane, route.subject, items, direct)
                stored.add_done_callback(functools.partial(_fail_unless_stored, pending.fail, route.subject))
                pending.resend_with(functools.partial(self._republish, route, items))
                published = time.perf_counter()
                results = await pending.wait(self.timeout_s)
            except BaseException:  # a timeout, a failed publish, the client gone (cancelled): nobody waits now
                self.publisher.abandon(request_id)
                raise
            waited = time.perf_counter()
        meta = collect_metadata(request_id, results, (published - started) * 1e3, (waited - published) * 1e3)
        meta.model_revision = model_revision(route.bundle_config_hash, results)
        return Collected(route, results, meta)

    async def stream(self, route: Route, build: Callable[[Ticket], WorkItem], trace: TraceHeaders | None) -> Streamed:
        """Publish the one work item `build` makes for a new request on `route`; the caller reads the chunks of the
        returned stream and closes it."""
        ticket = self._ticket(trace)
        item = build(ticket)
        direct = await self._admit(route, ticket.request_id, 1)
        chunks = self.collector.open_stream(ticket.request_id)
        streamed = Streamed(route, ticket.request_id, chunks, self.timeout_s, self.publisher.cancel_generation)
        started = time.perf_counter()
        try:
            streamed.hold(self.publisher.in_flight(route.lane, 1))
            stored = await self.publisher.publish(route.lane, route.subject, [item], direct)
            stored.add_done_callback(functools.partial(_fail_unless_stored, chunks.fail, route.subject))
            chunks.resend_with(functools.partial(self._republish, route, [item], [0]))
        except BaseException:
            streamed.close()
            raise
        streamed.publish_ms = (time.perf_counter() - started) * 1e3
        return streamed

    def _republish(self, route: Route, items: list[WorkItem], indexes: list[int]) -> None:
        """Publish `items[indexes]` again on the route's lane (the work of a request whose results may have been
        lost while the broker connection was down; the collector drops whatever arrives twice)."""
        self.publisher.republish(route.lane, route.subject, [items[index] for index in indexes])

    def _ticket(self, trace: TraceHeaders | None) -> Ticket:
        """A new request's name, reply subject and deadline (now + the request timeout)."""
        request_id, reply = self.publisher.new_request()
        note_request(request_id=request_id)
        now = time.time()
        return Ticket(request_id, reply, self.publisher.router_id, now, now + self.timeout_s, trace)

    async def _admit(self, route: Route, request_id: str, count: int) -> str | None:
        """Admit `count` items on the route's lane (PROVISIONING, backpressure); the worker subject a capped pool's
        work goes to (seed 000 §8.2: one of its assigned workers, on that worker's own subject), or None for the
        lane's."""
        assigned = self.pools.assigned(route.admission_pool) if route.admission_pool else None
        await self.publisher.admit(route.lane, count, route.bundle_config_hash, assigned, route.demand_lanes)
        if not assigned:
            return None
        worker = self.publisher.direct_worker(route.lane, request_id, route.bundle_config_hash, assigned)
        if worker is None:
            return None
        lane = route.lane
        return work_worker_subject(lane.pool, lane.machine_profile, lane.bundle, route.model_id, worker)


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
