"""Distributed tracing behind one facade (seed 000 §15.1; DESIGN §8): a per-process `TracerProvider` exporting spans as
protobuf over OTLP/HTTP, and the W3C trace context (`traceparent`, `tracestate`) that work items and IPC batch items
carry from the gateway through the sidecar to the worker.

A role creates one `Tracing` and passes it to the components that open spans; nothing here sets OpenTelemetry's
global provider, propagator or current context, so several `Tracing` objects (one per test) never mix. Off, no
provider exists and `enabled` is False: `span()` hands back one shared block that yields OpenTelemetry's
non-recording INVALID_SPAN, `headers` and `trace_id_of` answer None for it, so a traced step is written once and
its off path allocates nothing; attributes that cost something to build are set only `if span.is_recording()`.
A caller's context travels through work items whether tracing is on or off.

A span that serves several traces at once (a sidecar batch, a worker batch) is parented on the first valid context
of its items and links the other distinct ones (seed 000 §15.1 "batch fan-in").
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any, Final, Protocol

import attrs
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.trace import (
    INVALID_SPAN,
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    get_current_span,
)
from opentelemetry.trace import set_span_in_context as _in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from sie.settings import TelemetrySettings, TracingSettings
from sie.telemetry.export import GRPC, otlp_exporter, service_resource

logger = logging.getLogger(__name__)

TRACER_NAME: Final = "sie"
TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"
TRACES_PATH: Final = "/v1/traces"

# Span names: the request at the gateway, the sidecar's stages of a batch, the worker's run of it.
GATEWAY_REQUEST: Final = "gateway.request"
SIDECAR_PREPARE: Final = "sidecar.prepare"
SIDECAR_BATCH_WAIT: Final = "sidecar.batch_wait"
SIDECAR_DISPATCH: Final = "sidecar.dispatch"
WORKER_RUN_BATCH: Final = "worker.run_batch"
# Generation (seed 000 §15.1): the gateway's span of a native (or text-completion) and of a chat generation, each
# lasting as long as its stream, and the worker's span of one generation attempt.
GATEWAY_PROXY_GENERATE: Final = "gateway.proxy_generate"
GATEWAY_PROXY_CHAT: Final = "gateway.proxy_chat"
WORKER_STREAMING_PROCESSOR: Final = "worker.streaming_processor"

# Span kinds as plain names: reading an Enum member costs a lookup that the off path of a traced step need not pay.
SERVER_SPAN: Final = SpanKind.SERVER
CLIENT_SPAN: Final = SpanKind.CLIENT

# Shutdown exports what is queued for at most this long, so a collector that is gone cannot hold a stop (§15.1).
SHUTDOWN_FLUSH_S: Final = 3.0
# Parsed W3C contexts kept: more than the work items a sidecar holds at once.
EXTRACTED_CONTEXTS: Final = 4096
# W3C trace-context §3.2 (lowercase hex; version ff and all-zero ids are invalid), and §3.3: tracestate list
# members `key=value`, at most 32 of them, within the 512 characters every vendor must pass on. A tracestate
# that breaks these is dropped whole (the context is kept), never cut mid-entry.
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}(-.*)?")
_TRACESTATE_MEMBER = re.compile(
    r"(?:[a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13})"
    r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)
_MAX_TRACESTATE_CHARS: Final = 512
_MAX_TRACESTATE_MEMBERS: Final = 32


class Carrier(Protocol):
    """Anything that carries a W3C context: a work item, an IPC batch item, `TraceHeaders`."""

    @property
    def traceparent(self) -> str | None: ...

    @property
    def tracestate(self) -> str | None: ...


# The spans a span continues: one carrier (or None), or several (a batch's items).
Parents = Carrier | Iterable[Carrier | None] | None


@attrs.frozen
class TraceHeaders:
    """One W3C trace context as it travels: a valid `traceparent` and the `tracestate` that goes with it."""

    traceparent: str
    tracestate: str | None = None


def trace_headers(traceparent: str | None, tracestate: str | None = None) -> TraceHeaders | None:
    """The context a caller sent; None when `traceparent` is missing or not valid W3C (`tracestate` goes with it)."""
    if not traceparent:
        return None
    traceparent = traceparent.strip()
    match = _TRACEPARENT.fullmatch(traceparent)
    if match is None:
        return None
    version, trace_id, span_id, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or not trace_id.strip("0") or not span_id.strip("0"):
        return None
    return TraceHeaders(traceparent, tracestate if _valid_tracestate(tracestate) else None)


def _valid_tracestate(tracestate: str | None) -> bool:
    if not tracestate or len(tracestate) > _MAX_TRACESTATE_CHARS:
        return False
    members = [member.strip(" \t") for member in tracestate.split(",")]
    members = [member for member in members if member]
    return 0 < len(members) <= _MAX_TRACESTATE_MEMBERS and all(_TRACESTATE_MEMBER.fullmatch(m) for m in members)


def traces_endpoint(tracing: TracingSettings, telemetry: TelemetrySettings) -> str | None:
    """Where spans go: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as given, else `/v1/traces` under
    OTEL_EXPORTER_OTLP_ENDPOINT over HTTP, or that endpoint itself over gRPC; None when neither is set."""
    if tracing.traces_endpoint:
        return tracing.traces_endpoint
    if not telemetry.otlp_endpoint:
        return None
    return telemetry.otlp_endpoint if telemetry.otlp_protocol == GRPC else telemetry.otlp_endpoint + TRACES_PATH


def epoch_ns(monotonic_s: float) -> int:
    """A past `time.monotonic()` reading as unix nanoseconds (a span's start taken before the span was)."""
    return time.time_ns() - int((time.monotonic() - monotonic_s) * 1e9)


def mark_failed(span: Span, reason: str) -> None:
    """Mark `span` failed with a short reason of ours (never an exception's text: it may quote input)."""
    if span.is_recording():
        span.set_status(Status(StatusCode.ERROR, reason))


def trace_id_of(span: Span) -> str | None:
    """The span's trace id as 32 lowercase hex digits (the `X-Trace-ID` value); None for the INVALID_SPAN of
    tracing that is off (a span tracing did not sample still names its trace)."""
    if span is INVALID_SPAN:
        return None
    context = span.get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


def _enter_untraced() -> Span:
    return INVALID_SPAN


def _exit_untraced(exc_type: object, exc: object, tb: object) -> None:
    return None


class _Untraced(AbstractContextManager[Span]):
    """The block `Tracing.span` hands back while tracing is off: one shared object yielding INVALID_SPAN. Its
    methods are static, so `with` binds no method object: entering and leaving it allocates nothing."""

    __slots__ = ()
    __enter__ = staticmethod(_enter_untraced)  # type: ignore[assignment]
    __exit__ = staticmethod(_exit_untraced)  # type: ignore[assignment]


_UNTRACED: Final = _Untraced()


def sample_ratio(tracing: TracingSettings) -> float:
    """The share of trace ids a `traceidratio` sampler records: OTEL_TRACES_SAMPLER_ARG, else
    SIE_TRACING_SAMPLE_RATIO."""
    return tracing.sampler_arg if tracing.sampler_arg is not None else tracing.sample_ratio


def build_sampler(name: str, ratio: float) -> Sampler:
    """The OpenTelemetry sampler OTEL_TRACES_SAMPLER names (`parentbased_` ones follow a caller's decision)."""
    base = name.removeprefix("parentbased_")
    root: Sampler = {"always_on": ALWAYS_ON, "always_off": ALWAYS_OFF}.get(base) or TraceIdRatioBased(ratio)
    return ParentBased(root) if name.startswith("parentbased_") else root


class Tracing:
    """Owns this process's TracerProvider (None when off) and opens spans parented on W3C contexts."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer(TRACER_NAME) if provider is not None else None
        self._propagator = TraceContextTextMapPropagator()
        self.enabled = provider is not None
        # A work item's context is read by each span of its batch (prepare, wait, dispatch): parsed once.
        self._extract = functools.lru_cache(maxsize=EXTRACTED_CONTEXTS)(self._parse_context)

    @classmethod
    def off(cls) -> Tracing:
        """Tracing that records nothing (the default of every component)."""
        return cls()

    @classmethod
    def from_settings(
        cls, tracing: TracingSettings, telemetry: TelemetrySettings, default_service_name: str
    ) -> Tracing:
        """On when SIE_TRACING_ENABLED is set and an OTLP endpoint is known; the switch without an endpoint is warned
        about and left off, since serving must not depend on telemetry. The process is named as its metrics are
        (OTEL_SERVICE_NAME, else `default_service_name`; OTEL_RESOURCE_ATTRIBUTES)."""
        if not tracing.enabled:
            return cls.off()
        endpoint = traces_endpoint(tracing, telemetry)
        if endpoint is None:
            logger.warning(
                "SIE_TRACING_ENABLED is set but neither OTEL_EXPORTER_OTLP_TRACES_ENDPOINT nor "
                "OTEL_EXPORTER_OTLP_ENDPOINT is: no spans are exported"
            )
            return cls.off()
        resource = service_resource(telemetry, default_service_name)
        ratio = sample_ratio(tracing)
        logger.info("exporting spans to %s (sampler %s, ratio %s)", endpoint, tracing.sampler, ratio)
        return cls.exporting(endpoint, resource, ratio, tracing.sampler, telemetry.otlp_protocol)

    @classmethod
    def exporting(  # noqa: PLR0913 - where spans go and which are recorded
        cls,
        endpoint: str,
        resource: Resource,
        sample_ratio: float = 1.0,
        sampler: str = "parentbased_traceidratio",
        protocol: str = "http/protobuf",
    ) -> Tracing:
        """Tracing that batches spans to the OTLP `endpoint` over `protocol` (HTTP/protobuf or gRPC), choosing new
        traces with `sampler` (an OTEL_TRACES_SAMPLER name; `sample_ratio` for the trace-id ratio ones)."""
        provider = TracerProvider(sampler=build_sampler(sampler, sample_ratio), resource=resource,
                                  shutdown_on_exit=False)  # fmt: skip
        provider.add_span_processor(BatchSpanProcessor(otlp_exporter(protocol, "traces", endpoint)))
        return cls(provider)

    def start(
        self,
        name: str,
        parents: Parents,
        attributes: Mapping[str, Any] | None = None,
        *,
        kind: SpanKind = SpanKind.INTERNAL,
        start_ns: int | None = None,
    ) -> Span:
        """A started span, child of the first valid context among `parents` (a new trace when none is) and linked to
        the other distinct ones; the caller ends it. Only call while `enabled` (a block: `span`)."""
        if self._tracer is None:
            raise RuntimeError("Tracing.start called while tracing is off; this is a bug")
        contexts = self._distinct_contexts(parents)
        parent = _in_context(NonRecordingSpan(contexts[0]), Context()) if contexts else Context()
        links = [Link(context) for context in contexts[1:]]
        return self._tracer.start_span(
            name, context=parent, kind=kind, attributes=attributes, links=links, start_time=start_ns
        )

    def span(
        self,
        name: str,
        parents: Parents,
        attributes: Mapping[str, Any] | None = None,
        *,
        kind: SpanKind = SpanKind.INTERNAL,
    ) -> AbstractContextManager[Span]:
        """`start` as a block: the span ends with it, marked failed (by exception type only: messages may quote
        input) when the block raises. While tracing is off, one shared block yielding INVALID_SPAN."""
        if self._tracer is None:
            return _UNTRACED
        return self._recorded(self.start(name, parents, attributes, kind=kind))

    @staticmethod
    @contextlib.contextmanager
    def _recorded(span: Span) -> Iterator[Span]:
        try:
            yield span
        except BaseException as exc:
            mark_failed(span, type(exc).__name__)
            raise
        finally:
            span.end()

    def headers(self, span: Span) -> TraceHeaders | None:
        """The W3C context that makes `span` the parent of work done elsewhere; None for INVALID_SPAN (off)."""
        if span is INVALID_SPAN or not span.get_span_context().is_valid:
            return None
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=_in_context(span, Context()))
        return TraceHeaders(carrier[TRACEPARENT], carrier.get(TRACESTATE))

    def close(self) -> None:
        """Export the spans still queued, waiting at most SHUTDOWN_FLUSH_S, and stop the export thread."""
        provider, self._provider, self._tracer, self.enabled = self._provider, None, None, False
        if provider is None:
            return
        stopper = threading.Thread(target=provider.shutdown, name="sie-tracing-shutdown", daemon=True)
        stopper.start()
        stopper.join(SHUTDOWN_FLUSH_S)
        if stopper.is_alive():
            logger.warning("spans not exported within %.0f s of shutdown were dropped", SHUTDOWN_FLUSH_S)

    def _distinct_contexts(self, parents: Parents) -> list[SpanContext]:
        one = parents is None or hasattr(parents, "traceparent")
        carriers: Iterable[Carrier | None] = (parents,) if one else parents  # type: ignore[assignment]
        seen: dict[str, SpanContext] = {}
        for carrier in carriers:
            traceparent = carrier.traceparent if carrier is not None else None
            if not traceparent or traceparent in seen:
                continue
            context = self._extract(traceparent, carrier.tracestate)  # type: ignore[union-attr]
            if context.is_valid:
                seen[traceparent] = context
        return list(seen.values())

    def _parse_context(self, traceparent: str, tracestate: str | None) -> SpanContext:
        carrier = {TRACEPARENT: traceparent}
        if tracestate is not None:
            carrier[TRACESTATE] = tracestate
        return get_current_span(self._propagator.extract(carrier, context=Context())).get_span_context()
