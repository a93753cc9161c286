"""The inference path of one request, start to end: route, admit, build work items, register the collector
slots, publish, wait, assemble (seed 000 §2, §16.2). One method per operation; each is the single domain
call a handler makes. No web framework, no status codes: failures are the typed exceptions in errors.py.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import Any

import attrs

from sie.catalog.names import work_worker_subject
from sie.gateway import assembly, openai, router, workitems
from sie.gateway.collector import Collector
from sie.gateway.headers import ResponseMetadata, collect_metadata, model_revision
from sie.gateway.limits import RequestLimits
from sie.gateway.offload import PayloadOffload
from sie.gateway.pools import PoolDirectory
from sie.gateway.publisher import WorkPublisher, publish_error
from sie.gateway.router import LaneHints, Route, Router
from sie.gateway.workitems import Ticket
from sie.pools import PoolNotFoundError, canonical_pool_name
from sie.telemetry.requests import note_request
from sie.telemetry.tracing import TraceHeaders
from sie.wire.http import EncodeParams, EncodeRequest, ExtractParams, ExtractRequest, ScoreRequest
from sie.wire.queue import OPERATION_ENCODE, OPERATION_EXTRACT, OPERATION_SCORE, WorkItem, WorkResult


@attrs.frozen
class Served:
    """A successful answer: the body to render and the timings for its headers."""

    body: dict[str, Any]
    meta: ResponseMetadata


@attrs.frozen
class Collected:
    """Every result of one request, in item order, with the route it took and its timings."""

    route: Route
    results: list[WorkResult]
    meta: ResponseMetadata


async def route_request(router: Router, pools: PoolDirectory, spec: str, profile: Any, hints: LaneHints) -> Route:
    """The request's route; a pool it names must exist (seed 000 §16.3: missing named pools fail closed)."""
    requested = hints.requested_pool()
    if requested is None:
        return router.route(spec, profile, hints)
    target = await pools.target(requested)
    if target is None:
        raise PoolNotFoundError(f"pool '{canonical_pool_name(requested)}' not found")
    return router.route(spec, profile, hints, target)


async def admit(
    publisher: WorkPublisher, pools: PoolDirectory, route: Route, request_id: str, count: int
) -> str | None:
    """Admit `count` items on the route's lane (PROVISIONING, backpressure); the worker subject a capped pool's work
    goes to (seed 000 §8.2: one of its assigned workers, on that worker's own subject), or None for the lane's."""
    assigned = pools.assigned(route.admission_pool) if route.admission_pool else None
    await publisher.admit(route.lane, count, route.bundle_config_hash, assigned, route.demand_lanes)
    if not assigned:
        return None
    worker = publisher.direct_worker(route.lane, request_id, route.bundle_config_hash, assigned)
    if worker is None:
        return None
    lane = route.lane
    return work_worker_subject(lane.pool, lane.machine_profile, lane.bundle, route.model_id, worker)


def fail_unless_stored(fail: Callable[[BaseException], None], subject: str, stored: asyncio.Future[None]) -> None:
    """End a request's wait (`fail`) with the refusal when the stream did not store its items (a detached ACK drain
    that failed; a request already answered or gone is not affected)."""
    if stored.cancelled():
        return
    error = stored.exception()
    if error is not None:
        fail(publish_error(error, subject))


def _profile(options: dict[str, Any] | None) -> Any:
    return options.get("profile") if options else None


def _instruction(params: EncodeParams | ExtractParams | None) -> str | None:
    return params.instruction if params is not None else None


class InferenceService:
    """Encode, score and extract over the work queue."""

    def __init__(  # noqa: PLR0913 - the collaborators of the inference path
        self,
        router: Router,
        publisher: WorkPublisher,
        collector: Collector,
        timeout_s: float,
        pools: PoolDirectory,
        limits: RequestLimits | None = None,
        offload: PayloadOffload | None = None,
    ) -> None:
        self._router = router
        self._pools = pools
        self._publisher = publisher
        self._collector = collector
        self._timeout_s = timeout_s
        self._limits = limits or RequestLimits()
        self._offload = offload or PayloadOffload(None, lambda: None)

    async def encode(
        self, spec: str, request: EncodeRequest, hints: LaneHints, trace: TraceHeaders | None = None
    ) -> Served:
        collected = await self.encode_results(spec, request, hints, trace)
        failed = assembly.check_failures(collected.results)
        body = assembly.encode_body(collected.route.model, request.items, collected.results, failed)
        return Served(body, collected.meta)

    async def encode_results(
        self,
        spec: str,
        request: EncodeRequest,
        hints: LaneHints,
        trace: TraceHeaders | None = None,
        check: Callable[[Route], None] | None = None,
    ) -> Collected:
        """The raw results of an encode (the OpenAI surface reshapes them itself); `check` refuses, before any
        work is published, what the routed model cannot do."""
        note_request(model=spec, items=len(request.items))
        self._limits.check(request.items)
        params = request.params
        route = await self._route(spec, _profile(params.options if params else None), hints)
        outputs = router.encode_outputs(route, params.output_types if params else None)
        router.check_output_dtype(params)
        router.check_options(route, params.options if params else None, OPERATION_ENCODE, _instruction(params))
        if check is not None:
            check(route)
        return await self._run(route, lambda ticket: workitems.encode_work(route, ticket, request, outputs), trace)

    async def embeddings(
        self, call: openai.EmbeddingsCall, hints: LaneHints, trace: TraceHeaders | None = None
    ) -> Served:
        """OpenAI embeddings: an encode whose every item must succeed, reshaped under the 16 MiB reply cap."""
        call = await openai.with_decoded_tokens(call)
        check = functools.partial(_check_dimensions, call)
        collected = await self.encode_results(call.model, call.encode_request(), hints, trace, check)
        assembly.check_failures(collected.results, strict=True)
        openai.check_reply_size(collected.results)
        return Served(openai.embeddings_body(call, collected.results), collected.meta)

    async def score(
        self, spec: str, request: ScoreRequest, hints: LaneHints, trace: TraceHeaders | None = None
    ) -> Served:
        note_request(model=spec, items=len(request.items))
        self._limits.check(request.items, request.query)
        route = await self._route(spec, _profile(request.options), hints)
        router.check_score(route)
        router.check_options(route, request.options, OPERATION_SCORE, request.instruction)
        collected = await self._run(route, lambda ticket: workitems.score_work(route, ticket, request), trace)
        assembly.check_failures(collected.results, per_item=False)
        body = assembly.score_body(route.model, request.query.id, collected.results[0])
        return Served(body, collected.meta)

    async def extract(
        self, spec: str, request: ExtractRequest, hints: LaneHints, trace: TraceHeaders | None = None
    ) -> Served:
        note_request(model=spec, items=len(request.items))
        self._limits.check(request.items)
        params = request.params
        route = await self._route(spec, _profile(params.options if params else None), hints)
        router.check_extract(route, params)
        router.check_options(route, params.options if params else None, OPERATION_EXTRACT, _instruction(params))
        collected = await self._run(route, lambda ticket: workitems.extract_work(route, ticket, request), trace)
        failed = assembly.check_failures(collected.results)
        body = assembly.extract_body(route.model, request.items, collected.results, failed)
        return Served(body, collected.meta)

    async def _route(self, spec: str, profile: Any, hints: LaneHints) -> Route:
        return await route_request(self._router, self._pools, spec, profile, hints)

    async def _run(
        self, route: Route, build: Callable[[Ticket], list[WorkItem]], trace: TraceHeaders | None
    ) -> Collected:
        request_id, reply = self._publisher.new_request()
        note_request(request_id=request_id)
        now = time.time()
        items = build(Ticket(request_id, reply, self._publisher.router_id, now, now + self._timeout_s, trace))
        direct = await admit(self._publisher, self._pools, route, request_id, len(items))
        with (
            self._collector.expect(request_id, len(items)) as pending,
            self._publisher.in_flight(route.lane, len(items)),
        ):
            items = await self._offload.prepare(items, pending.at_close)  # large payloads via the store
            started = time.perf_counter()
            try:
                stored = await self._publisher.publish(route.lane, route.subject, items, direct)
                stored.add_done_callback(functools.partial(fail_unless_stored, pending.fail, route.subject))
                published = time.perf_counter()
                results = await pending.wait(self._timeout_s)
            except BaseException:  # a timeout, a failed publish, the client gone (cancelled): nobody waits now
                self._publisher.abandon(request_id)
                raise
            waited = time.perf_counter()
        meta = collect_metadata(request_id, results, (published - started) * 1e3, (waited - published) * 1e3)
        meta.model_revision = model_revision(route.bundle_config_hash, results)
        return Collected(route, results, meta)


def _check_dimensions(call: openai.EmbeddingsCall, route: Route) -> None:
    openai.check_dimensions(call, route.config)
