"""An OTLP/HTTP receiver on loopback, as a collector would be: it accepts protobuf exports (gzip or plain), decodes
them with the collector's own messages from `opentelemetry-proto`, answers as the OTLP specification says, and keeps
what it received for tests to read. Every signal's export is accepted and counted; traces are decoded into
`ReceivedSpan`s and metrics into `ReceivedPoint`s (a signal whose content a test reads gets its own decoder).
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import attrs
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

TRACES_PATH = "/v1/traces"
METRICS_PATH = "/v1/metrics"
SIGNAL_PATHS = (TRACES_PATH, METRICS_PATH, "/v1/logs")
# Every Export*ServiceResponse without a partial success is the empty message, serialized as no bytes.
FULL_SUCCESS = b""
PROTOBUF = "application/x-protobuf"


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind is not None else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


@attrs.frozen
class ReceivedSpan:
    """One exported span: its ids as lowercase hex ("" for no parent), name, attributes, links and the resource
    attributes of the process that sent it (`service.name`, `process.pid`)."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    links: tuple[tuple[str, str], ...]  # (trace id, span id) of each link
    resource: dict[str, Any]
    status_code: int

    @property
    def service(self) -> str:
        return str(self.resource.get("service.name", ""))

    @property
    def pid(self) -> int:
        return int(self.resource.get("process.pid", 0))


def decode_traces(body: bytes) -> list[ReceivedSpan]:
    """Every span of one ExportTraceServiceRequest."""
    request = ExportTraceServiceRequest.FromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        attributes=_attributes(span.attributes),
                        links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
                        resource=resource,
                        status_code=span.status.code,
                    )
                )
    return spans


@attrs.frozen
class ReceivedPoint:
    """One exported metric data point: the instrument's name and unit, its attributes, the value (a sum's or a
    gauge's; a histogram's count, with `total` its sum) and the resource attributes of the process that sent it."""

    name: str
    unit: str
    attributes: dict[str, Any]
    value: float
    resource: dict[str, Any]
    total: float | None = None

    @property
    def service(self) -> str:
        return str(self.resource.get("service.name", ""))


def decode_metrics(body: bytes) -> list[ReceivedPoint]:
    """Every data point of one ExportMetricsServiceRequest (sums, gauges and histograms)."""
    request = ExportMetricsServiceRequest.FromString(body)
    points = []
    for resource_metrics in request.resource_metrics:
        resource = _attributes(resource_metrics.resource.attributes)
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                kind = metric.WhichOneof("data")
                for point in getattr(metric, kind).data_points:
                    if kind == "histogram":
                        value, total = float(point.count), point.sum
                    else:
                        value, total = float(getattr(point, point.WhichOneof("value"))), None
                    attributes = _attributes(point.attributes)
                    points.append(ReceivedPoint(metric.name, metric.unit, attributes, value, resource, total))
    return points


class OtlpReceiver:
    """Received exports by path (`posts`), the decoded spans (`spans()`) and metric points (`points()`); safe to read
    while exports arrive."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.posts: dict[str, int] = {}
        self._spans: list[ReceivedSpan] = []
        self._points: list[ReceivedPoint] = []
        self.url = ""

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def points(self) -> list[ReceivedPoint]:
        """Every metric data point received so far, in arrival order (cumulative values: the last is the latest)."""
        with self._lock:
            return list(self._points)

    def post_count(self, path: str = TRACES_PATH) -> int:
        """Exports received on `path`."""
        with self._lock:
            return self.posts.get(path, 0)

    def receive(self, path: str, body: bytes) -> bytes | None:
        """The protobuf answer to an export on `path`, or None for a path that is no OTLP signal's."""
        if path not in SIGNAL_PATHS:
            return None
        spans = decode_traces(body) if path == TRACES_PATH else []
        points = decode_metrics(body) if path == METRICS_PATH else []
        with self._lock:
            self.posts[path] = self.posts.get(path, 0) + 1
            self._spans.extend(spans)
            self._points.extend(points)
        return FULL_SUCCESS


def _handler(receiver: OtlpReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the name http.server dispatches to
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            answer = receiver.receive(self.path, body)
            if answer is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("content-type", PROTOBUF)
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's signature
            pass

    return Handler


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """A receiver listening on a free loopback port (`receiver.url`, no path) until the block ends."""
    receiver = OtlpReceiver()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextmanager
def otlp_grpc_receiver() -> Iterator[OtlpReceiver]:
    """The same receiver serving OTLP over gRPC (the collector's TraceService and MetricsService) on a free loopback
    port (`receiver.url`: `http://127.0.0.1:PORT`, plain text) until the block ends."""
    from concurrent.futures import ThreadPoolExecutor

    import grpc
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    receiver = OtlpReceiver()

    class Traces(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - the service's method name
            receiver.receive(TRACES_PATH, request.SerializeToString())
            return trace_service_pb2.ExportTraceServiceResponse()

    class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - the service's method name
            receiver.receive(METRICS_PATH, request.SerializeToString())
            return metrics_service_pb2.ExportMetricsServiceResponse()

    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    receiver.url = f"http://127.0.0.1:{port}"
    try:
        yield receiver
    finally:
        server.stop(grace=None)
