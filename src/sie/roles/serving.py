"""What every role wires alike: running its main coroutine on the configured event loop (exit status 2 with one
line for setup errors), the baseline catalogue, the process's tracing and metrics, `/metrics`, and the HTTP listener.
It imports no role's stack: the worker, the gateway and the sidecar are wired in their own modules.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable, Coroutine, Iterable, Mapping
from contextlib import AsyncExitStack
from typing import Any

from starlette.routing import Route

from sie.catalog import Catalog, bundle_errors, read_catalog
from sie.http.handlers import plain_handler_routes
from sie.http.serving import HttpListener
from sie.ipc.sockets import SocketPathError
from sie.runtime import run_event_loop
from sie.settings import Settings, ignored_variables_note
from sie.telemetry.exposition import METRICS_PATH, ChildSource, MetricsEndpoint
from sie.telemetry.logs import configure_logging, log_fields
from sie.telemetry.metrics import ModelLabels, Telemetry
from sie.telemetry.tracing import Tracing

logger = logging.getLogger(__name__)

RoleMain = Callable[[Settings], Coroutine[Any, Any, None]]


class RoleSetupError(Exception):
    """Settings that parse but cannot work together in this role; the CLI prints the message and exits 2."""


def run_main(main: RoleMain, settings: Settings) -> int:
    """Log as configured and run `main(settings)` on the event loop SIE_EVENT_LOOP names; exit status 0, or 2
    with one line on stderr when the settings cannot work on this host (RoleSetupError: say, the devices
    SIE_WORKER_DEVICES asks for are missing) or the worker's socket path is taken."""
    configure_logging(settings.telemetry)
    note = ignored_variables_note(settings.process.role)
    if note is not None:
        logger.info(note)
    try:
        run_event_loop(main(settings), settings.process.event_loop)
    except (SocketPathError, RoleSetupError) as exc:
        print(f"sie: {exc}", file=sys.stderr)
        return 2
    return 0


def baseline_catalog(settings: Settings) -> Catalog:
    """The filesystem catalogue (SIE_BUNDLES_DIR, SIE_MODELS_DIR) a role starts from. A model file the role cannot
    serve (invalid, or naming an adapter module no bundle runs) is logged once with its path and reason and left
    out, and the rest is served (`Catalog.problems` lists it); a bundle file that fails stops the role
    (RoleSetupError), since what every model routes to depends on the bundles."""
    catalog, errors = read_catalog(settings.catalog.bundles_dir, settings.catalog.models_dir)
    failed_bundles = bundle_errors(errors, settings.catalog.bundles_dir)
    if failed_bundles:
        raise RoleSetupError("bundles failed to load: " + "; ".join(error.describe() for error in failed_bundles))
    for error in errors:
        fields = log_fields(event="model_config_refused", model=error.model_id, source=error.source)
        logger.warning("model config left out (not servable): %s", error.describe(), extra=fields)
    return catalog


def open_tracing(stack: AsyncExitStack, settings: Settings, service_name: str) -> Tracing:
    """This process's tracing (SIE_TRACING_ENABLED), named `service_name` unless OTEL_SERVICE_NAME says otherwise.
    Enter it first: `stack` closes it last, flushing queued spans for a bounded time off the event loop."""
    tracing = Tracing.from_settings(settings.tracing, settings.telemetry, service_name)
    stack.push_async_callback(asyncio.to_thread, tracing.close)
    return tracing


def open_telemetry(
    stack: AsyncExitStack, settings: Settings, service_name: str, attributes: Mapping[str, str] | None = None
) -> Telemetry:
    """This process's metrics (SIE_METRICS_ENABLED; pushed over OTLP when an endpoint is set), named `service_name`
    unless OTEL_SERVICE_NAME says otherwise. `stack` pushes the last values at exit, off the event loop."""
    telemetry = Telemetry(service_name, settings.telemetry, attributes)
    stack.push_async_callback(asyncio.to_thread, telemetry.shutdown)
    return telemetry


def metrics_routes(telemetry: Telemetry, children: Callable[[], Iterable[ChildSource]] | None = None) -> list[Route]:
    """`GET /metrics` for a starlette app: `telemetry`'s series, then the worker children's."""
    return plain_handler_routes(MetricsEndpoint(telemetry, children).handle, [METRICS_PATH])


def catalogue_labels(catalog: Callable[[], Catalog]) -> ModelLabels:
    """Model labels bounded by the current catalogue: its ids, `other` for any id it does not know."""

    def catalogue_id(model_id: str) -> str | None:
        entry = catalog().find(model_id)
        return entry.model_id if entry is not None else None

    return ModelLabels(catalogue_id)


def http_listener(host: str, port: int, settings: Settings) -> HttpListener:
    """Where and how a role serves HTTP: its bind, SIE_SHUTDOWN_GRACE_S to drain, SIE_HTTP_SERVER."""
    return HttpListener(host, port, settings.process.shutdown_grace_s, settings.process.http_server)
