"""`build_gateway_app`: the gateway's starlette application, composed from what it reads and where it sends
work (`GatewaySources`) and its settings. The lifespan runs the result collector; serving it (hypercorn or
uvicorn, SIE_HTTP_SERVER) and the SIGTERM drain are the role file's job, through `serving_state(app)`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

import attrs
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from sie.gateway.cluster_status import ClusterSources, ClusterStatus
from sie.gateway.collector import Collector
from sie.gateway.config_sync import HeartbeatSource
from sie.gateway.dead_letters import DeadLetterQueue
from sie.gateway.dispatch import Dispatcher
from sie.gateway.generation import GenerationService
from sie.gateway.http.auth import AuthMiddleware, GatewayAuth
from sie.gateway.http.compat import DialectHandlers, dialect_routes
from sie.gateway.http.config import config_routes
from sie.gateway.http.dead_letters import dead_letter_routes
from sie.gateway.http.edge import reply_response
from sie.gateway.http.generation import GenerationHandlers
from sie.gateway.http.inference import InferenceHandlers
from sie.gateway.http.kserve import KServeHandlers, kserve_routes
from sie.gateway.http.pools import pool_routes
from sie.gateway.http.reads import ReadHandlers
from sie.gateway.http.replies import error_reply, route_error_reply, surface_for_path
from sie.gateway.http.scaling import scaling_routes
from sie.gateway.http.shutdown import ServingState, ShutdownMiddleware
from sie.gateway.http.status_page import StatusPages, status_routes
from sie.gateway.inference import InferenceService
from sie.gateway.limits import RequestLimits
from sie.gateway.offload import PayloadOffload
from sie.gateway.pools import PoolDirectory
from sie.gateway.publisher import AdmissionLimits, KnownMachineProfiles, LaneConsumers, WorkPublisher
from sie.gateway.router import CatalogSource, Router
from sie.gateway.scaling import LaneSignals
from sie.gateway.status import ModelStatusSource
from sie.gateway.traffic import TrafficWindow
from sie.pools import DemandTracker, MemoryPoolStore
from sie.settings import GatewaySettings, LaneSettings, PoolSettings
from sie.settings.gateway import LOOPBACK_HOST
from sie.telemetry.access import log_access
from sie.telemetry.gateway import GatewayMetrics
from sie.telemetry.requests import ObservedRequests, RequestObserver
from sie.telemetry.tracing import Tracing
from sie.transport.base import Transport


def _routes(inference: InferenceHandlers, generation: GenerationHandlers, read: ReadHandlers) -> list[Route]:
    return [
        Route("/v1/encode/{model:path}", inference.encode, methods=["POST"]),
        Route("/v1/score/{model:path}", inference.score, methods=["POST"]),
        Route("/v1/extract/{model:path}", inference.extract, methods=["POST"]),
        Route("/v1/embeddings", inference.embeddings, methods=["POST"]),
        Route("/v1/generate/{model:path}", generation.generate, methods=["POST"]),
        Route("/v1/chat/completions", generation.chat_completions, methods=["POST"]),
        Route("/v1/responses", generation.responses, methods=["POST"]),
        Route("/v1/completions", generation.completions, methods=["POST"]),
        Route("/v1/models", read.list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", read.get_model, methods=["GET"]),
        Route("/healthz", read.healthz, methods=["GET"]),
        Route("/readyz", read.readyz, methods=["GET"]),
        Route("/health", read.health, methods=["GET"]),
    ]


async def _http_error(request: Request, exc: Exception) -> Response:
    # Unknown routes and methods: `{"detail": "Not Found"}`, as sie-server (FastAPI) answers.
    if not isinstance(exc, HTTPException):
        return await _unexpected(request, exc)
    response = reply_response(route_error_reply(exc.status_code, exc.detail))
    response.headers.update(exc.headers or {})
    return response


async def _unexpected(request: Request, exc: Exception) -> Response:
    # Last resort for a failure outside the handlers' wrapper: an envelope, never a traceback.
    return reply_response(error_reply(exc, surface_for_path(request.url.path)))


@attrs.frozen
class GatewaySources:
    """What the gateway reads and where it sends work; `transport` must be entered (started) before the app's
    lifespan starts, and outlive it."""

    catalog: CatalogSource  # the current model catalogue
    transport: Transport  # publishes work items, carries results back
    consumers: LaneConsumers  # whether a lane is served now (PROVISIONING otherwise)
    status: ModelStatusSource  # model and worker state for `/v1/models` and `/health`
    heartbeats: HeartbeatSource | None = None  # healthy workers' heartbeats, where the gateway hears them
    routing_reason: Callable[[], str | None] | None = None  # why requests cannot be routed now (broker down), or None
    dead_letters: DeadLetterQueue | None = None  # work that used every delivery, served on `/v1/dlq`
    auth: GatewayAuth = attrs.field(factory=GatewayAuth)  # who may call which route; by default everyone, all
    offload: PayloadOffload | None = None  # large work-item payloads through the payload store (none: inline)
    metrics: GatewayMetrics | None = None  # requests, admission and lane series for `/metrics`; None: none
    tracing: Tracing | None = None  # spans of inference requests (SIE_TRACING_ENABLED); None: none recorded
    # Pools requests may name and the API writes (entered by the caller); None: pools in this process's memory,
    # refreshed while the app runs.
    pools: PoolDirectory | None = None
    signals: LaneSignals | None = None  # pending demand, queue depths, warm floors; None: built over `pools`


def build_gateway_app(  # noqa: PLR0913 - the sources, the settings, and what each role adds
    sources: GatewaySources,
    settings: GatewaySettings,
    lane: LaneSettings,
    router_id: str,
    extra_routes: Sequence[BaseRoute] = (),
    pool_settings: PoolSettings | None = None,
    grpc_host: str = LOOPBACK_HOST,
) -> Starlette:
    """The gateway ASGI app; `lane` is where requests go whose headers name none. `extra_routes` are served
    beside the API (in `--role all`, the placement control surface and `/metrics` of the worker children). With
    `settings.grpc_port` set, its lifespan also serves the KServe gRPC service on `grpc_host` (the HTTP server's)."""
    pool_settings = pool_settings or PoolSettings()
    serving = ServingState()
    collector = Collector(sources.transport, router_id)
    if sources.metrics is not None:
        sources.metrics.watch_result_chunks(collector.chunk_budget)
    own_pools = sources.pools is None
    pools = sources.pools or PoolDirectory(
        MemoryPoolStore(),
        pool_settings.static_queue_pools,
        pool_settings.default_ttl_s,
        sources.status.workers,
        catalog=sources.catalog,
    )
    signals = sources.signals or LaneSignals(
        DemandTracker(pool_settings.demand_ttl_s), pools.warm_floors, sources.status.workers, pools.pinned_models_loaded
    )
    router = Router(sources.catalog, lane, settings.configured_gpus)
    admission_limits = AdmissionLimits(
        settings.max_stream_pending,
        pool_settings.max_lane_in_flight_items,
        pool_settings.lane_backpressure_enforce,
        _known_machine_profiles(sources.status, lane, settings.configured_gpus, pools),
    )
    publisher = WorkPublisher(
        sources.transport, sources.consumers, router_id, admission_limits, sources.metrics, signals.demand
    )
    limits = RequestLimits(
        settings.max_items, settings.max_item_chars, settings.max_labels, settings.max_images_per_item,
        settings.max_image_bytes, settings.max_image_pixels,
    )  # fmt: skip
    offload = sources.offload or PayloadOffload(None, lambda: None)
    dispatcher = Dispatcher(router, pools, publisher, collector, settings.request_timeout_s, offload)
    service = InferenceService(dispatcher, limits)
    inference = InferenceHandlers(service, settings.max_body_bytes, sources.tracing)
    dialects = DialectHandlers(
        service, settings.max_body_bytes, sources.tracing, sources.catalog, settings.max_items,
        dict(settings.compat_default_models),
    )  # fmt: skip
    generation = GenerationHandlers(GenerationService(dispatcher, limits), settings.max_body_bytes, sources.tracing)
    pinning = sources.pools.pinning_pools if sources.pools is not None else None
    read = ReadHandlers(sources.catalog, sources.status, serving, settings.configured_gpus, sources.routing_reason,
                        pinning)  # fmt: skip
    kserve = KServeHandlers(service, settings.max_body_bytes, sources.tracing, sources.catalog, read.is_ready)
    traffic = TrafficWindow()  # inference requests per second and their latency, for the status page
    kserve_grpc = None
    if settings.grpc_port is not None:
        # Imported only here: its protobuf messages are built at import, which a gateway without gRPC never needs.
        from sie.gateway.http.kserve_grpc import KServeGrpc, grpc_authorizer

        authorize = grpc_authorizer(sources.auth)
        kserve_grpc = KServeGrpc(service, sources.catalog, serving, read.is_ready, authorize, settings.max_body_bytes,
                                 _request_observers(sources.metrics, traffic))  # fmt: skip
    cluster = ClusterSources(
        sources.catalog, sources.status, sources.transport, lambda: len(collector), lane.pool, settings.configured_gpus
    )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with collector, pools if own_pools else contextlib.nullcontext():
            if kserve_grpc is not None:
                app.state.grpc_port = await kserve_grpc.start(grpc_host, settings.grpc_port)
            serving.started = True
            try:
                yield
            finally:
                serving.started = False
                if kserve_grpc is not None:
                    await kserve_grpc.stop()

    app = Starlette(
        routes=[
            *_routes(inference, generation, read),
            *config_routes(sources.catalog, sources.heartbeats),
            *dead_letter_routes(sources.dead_letters),
            *pool_routes(pools),
            *scaling_routes(signals),
            *extra_routes,
            *status_routes(StatusPages(ClusterStatus(cluster, traffic), serving)),
            *kserve_routes(kserve),
            *dialect_routes(dialects),  # last: TEI's routes take any other path as a model
        ],
        middleware=[
            # Outermost: it times what the client sees, auth refusals and drain 503s included.
            Middleware(ObservedRequests, observers=_request_observers(sources.metrics, traffic)),
            # Auth off (no token mode, no admin token): no middleware frame at all on the request path.
            *([Middleware(AuthMiddleware, auth=sources.auth)] if sources.auth.enforcing else []),
            Middleware(ShutdownMiddleware, serving=serving),
        ],
        exception_handlers={HTTPException: _http_error, Exception: _unexpected},
        lifespan=lifespan,
    )
    app.state.serving = serving
    app.state.collector = collector
    return app


def _known_machine_profiles(
    status: ModelStatusSource, lane: LaneSettings, configured: Sequence[str], pools: PoolDirectory
) -> KnownMachineProfiles:
    """The machine profiles requests may wait for: the default lane's, the configured ones, the live workers' and
    the ones the pools ask for."""
    return lambda: {
        lane.machine_profile,
        *configured,
        *(worker.machine_profile for worker in status.workers()),
        *pools.machine_profiles(),
    }


def _request_observers(metrics: GatewayMetrics | None, traffic: TrafficWindow) -> list[RequestObserver]:
    """Who hears of each answered request: the access log, the request metrics (when on), the status page."""
    return [log_access, *([metrics.http.observe] if metrics is not None else []), traffic.observe]


def serving_state(app: Starlette) -> ServingState:
    """The app's serving state: `begin_shutdown()` on SIGTERM, then `await drain(timeout_s)`."""
    return app.state.serving


def collector_of(app: Starlette) -> Collector:
    """The app's result collector (`len()` is the number of requests waiting for results)."""
    return app.state.collector
