"""Spans of the tracing facade as an OTLP/HTTP collector receives them: parents, batch fan-in links, sampling, and
the flush at close."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.resources import Resource

from sie.telemetry.tracing import TRACES_PATH, TraceHeaders, Tracing, trace_headers
from support.otlp import OtlpReceiver, otlp_receiver

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
CLIENT = trace_headers(f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", "congo=t61rcWkgMzE")
OTHER = trace_headers("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
UNSAMPLED = trace_headers("00-5bf92f3577b34da6a3ce929d0e0e4736-10f067aa0ba902b7-00")


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with otlp_receiver() as running:
        yield running


def _tracing(receiver: OtlpReceiver, sample_ratio: float = 1.0) -> Tracing:
    resource = Resource({"service.name": "sie-test", "process.pid": 1})
    return Tracing.exporting(receiver.url + TRACES_PATH, resource, sample_ratio)


def test_a_span_continues_the_callers_trace_and_its_children_nest_under_it(receiver: OtlpReceiver) -> None:
    tracing = _tracing(receiver)
    with tracing.span("gateway.request", [CLIENT], {"sie.model": "m"}) as parent:
        carried = tracing.headers(parent)
        with tracing.span("sidecar.dispatch", [carried]):
            pass
    tracing.close()  # flushes what is queued
    spans = {span.name: span for span in receiver.spans()}
    request, dispatch = spans["gateway.request"], spans["sidecar.dispatch"]
    assert (request.trace_id, request.parent_span_id) == (CLIENT_TRACE, CLIENT_SPAN)
    assert (dispatch.trace_id, dispatch.parent_span_id) == (CLIENT_TRACE, request.span_id)
    assert carried.traceparent == f"00-{CLIENT_TRACE}-{request.span_id}-01"
    assert carried.tracestate == "congo=t61rcWkgMzE"  # the caller's vendor state travels on
    assert request.attributes == {"sie.model": "m"} and request.service == "sie-test"


def test_a_batch_span_parents_on_its_first_context_and_links_the_other_distinct_ones(receiver: OtlpReceiver) -> None:
    tracing = _tracing(receiver)
    broken = TraceHeaders("00-zz-yy-01")  # from a producer that is not our gateway
    tracing.start("worker.run_batch", [None, broken, CLIENT, CLIENT, OTHER, OTHER]).end()
    tracing.close()
    (span,) = receiver.spans()
    assert (span.trace_id, span.parent_span_id) == (CLIENT_TRACE, CLIENT_SPAN)
    assert span.links == (("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"),)


def test_a_batch_of_no_context_starts_a_trace(receiver: OtlpReceiver) -> None:
    tracing = _tracing(receiver)
    tracing.start("sidecar.prepare", [None]).end()
    tracing.close()
    (span,) = receiver.spans()
    assert span.parent_span_id == "" and span.trace_id != CLIENT_TRACE


def test_sampling_records_a_share_of_new_traces_and_follows_the_callers_decision(receiver: OtlpReceiver) -> None:
    tracing = _tracing(receiver, sample_ratio=0.0)
    new_trace = tracing.start("gateway.request", [None])
    new_trace.end()
    declined = tracing.start("gateway.request", [UNSAMPLED])
    declined.end()
    tracing.start("gateway.request", [CLIENT]).end()  # the caller sampled it: recorded whatever the ratio
    tracing.close()
    assert [span.trace_id for span in receiver.spans()] == [CLIENT_TRACE]
    # An unrecorded span still hands its context on, marked unsampled, so downstream processes agree.
    assert not _sampled(tracing.headers(declined)) and not _sampled(tracing.headers(new_trace))


def _sampled(headers: TraceHeaders) -> bool:
    return bool(int(headers.traceparent.rsplit("-", 1)[1], 16) & 1)


def test_a_failed_block_marks_its_span_failed_by_exception_type(receiver: OtlpReceiver) -> None:
    tracing = _tracing(receiver)
    with pytest.raises(KeyError), tracing.span("worker.run_batch", [CLIENT]):
        raise KeyError("a secret text")
    tracing.close()
    (span,) = receiver.spans()
    assert span.status_code == 2  # STATUS_CODE_ERROR


def test_close_returns_within_its_bound_when_the_collector_is_gone() -> None:
    with otlp_receiver() as gone:
        url = gone.url
    tracing = Tracing.exporting(url + TRACES_PATH, Resource({"service.name": "sie-test"}))
    tracing.start("gateway.request", [CLIENT]).end()
    tracing.close()  # the export fails (connection refused); close still returns
    assert tracing.enabled is False
