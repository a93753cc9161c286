"""The W3C context a caller sends, where spans are exported to, and tracing that is off."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sie.settings import load_settings
from sie.telemetry.tracing import (
    INVALID_SPAN,
    TraceHeaders,
    Tracing,
    mark_failed,
    trace_headers,
    trace_id_of,
    traces_endpoint,
)

VALID = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TWO_MEMBERS = "rojo=00f067aa0ba902b7, congo=t61rcWkgMzE,"


@pytest.mark.parametrize(
    ("traceparent", "tracestate", "expected"),
    [
        (VALID, None, TraceHeaders(VALID)),
        (VALID, "congo=t61rcWkgMzE", TraceHeaders(VALID, "congo=t61rcWkgMzE")),
        (f"  {VALID} ", None, TraceHeaders(VALID)),
        # a later version may add fields after the flags; version 00 may not
        ("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra", None,
         TraceHeaders("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra")),
        (VALID + "-extra", None, None),
        ("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", None, None),
        ("00-00000000000000000000000000000000-b7ad6b7169203331-01", None, None),
        ("00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", None, None),
        (VALID.upper(), None, None),
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b71692033-01", None, None),
        ("not a traceparent", "congo=t61rcWkgMzE", None),
        ("", None, None),
        (None, "congo=t61rcWkgMzE", None),
        # a tracestate that is not W3C list members is dropped whole, the context kept
        (VALID, "a=" + "b" * 600, TraceHeaders(VALID)),
        (VALID, TWO_MEMBERS, TraceHeaders(VALID, TWO_MEMBERS)),
        (VALID, "tenant@vendor=x", TraceHeaders(VALID, "tenant@vendor=x")),
        (VALID, "Upper=x", TraceHeaders(VALID)),
        (VALID, "novalue", TraceHeaders(VALID)),
        (VALID, "a=b=c", TraceHeaders(VALID)),
        (VALID, "a=caf\u00e9", TraceHeaders(VALID)),
        (VALID, ",".join(f"k{i}=v" for i in range(33)), TraceHeaders(VALID)),
        (VALID, " ", TraceHeaders(VALID)),
    ],
)  # fmt: skip
def test_a_callers_traceparent_is_kept_only_when_valid_w3c(
    traceparent: str | None, tracestate: str | None, expected: TraceHeaders | None
) -> None:
    assert trace_headers(traceparent, tracestate) == expected


def test_the_traces_endpoint_wins_over_the_generic_one_which_gets_the_traces_path() -> None:
    generic = load_settings({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"})
    assert traces_endpoint(generic.tracing, generic.telemetry) == "http://collector:4318/v1/traces"
    both = load_settings(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1/x"}
    )
    assert traces_endpoint(both.tracing, both.telemetry) == "http://t:1/x"
    neither = load_settings({})
    assert traces_endpoint(neither.tracing, neither.telemetry) is None


def test_over_grpc_the_generic_endpoint_is_used_as_given() -> None:
    from sie.telemetry.export import metrics_endpoint

    grpc = load_settings(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    )
    assert traces_endpoint(grpc.tracing, grpc.telemetry) == "http://collector:4317"
    assert metrics_endpoint(grpc.telemetry) == "http://collector:4317"
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_PROTOCOL"):
        load_settings({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


def test_tracing_is_off_unless_switched_on_with_an_endpoint(caplog: pytest.LogCaptureFixture) -> None:
    unset = load_settings({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert Tracing.from_settings(unset.tracing, unset.telemetry, "sie-test").enabled is False
    no_endpoint = load_settings({"SIE_TRACING_ENABLED": "true"})
    with caplog.at_level(logging.WARNING, logger="sie.telemetry.tracing"):
        tracing = Tracing.from_settings(no_endpoint.tracing, no_endpoint.telemetry, "sie-test")
    assert tracing.enabled is False
    assert "no spans are exported" in caplog.text


def test_spans_cannot_be_opened_while_tracing_is_off() -> None:
    tracing = Tracing.off()
    with pytest.raises(RuntimeError, match="this is a bug"):
        tracing.start("x", [])
    tracing.close()  # nothing to flush


def test_a_span_block_while_tracing_is_off_is_one_shared_block_yielding_the_invalid_span() -> None:
    tracing = Tracing.off()
    block = tracing.span("x", TraceHeaders(VALID), {"a": 1})
    assert block is tracing.span("y", [None, TraceHeaders(VALID)])  # built once: nothing allocated per call
    with block as span:
        assert span is INVALID_SPAN and not span.is_recording()
        mark_failed(span, "nothing to mark")
        assert tracing.headers(span) is None and trace_id_of(span) is None
    with pytest.raises(KeyError), tracing.span("x", None):
        raise KeyError("the block hides nothing")


def test_one_carrier_is_a_parent_as_a_list_of_it_is() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(provider)
    with tracing.span("one", TraceHeaders(VALID)) as one, tracing.span("listed", [TraceHeaders(VALID)]) as listed:
        assert tracing.headers(one) is not None and trace_id_of(one) == trace_id_of(listed) == VALID.split("-")[1]
    with tracing.span("new trace", None) as fresh:
        assert trace_id_of(fresh) not in (None, VALID.split("-")[1])
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert spans["one"].parent == spans["listed"].parent and spans["one"].parent.span_id == int(VALID[36:52], 16)
    assert spans["new trace"].parent is None
    tracing.close()


def test_the_sample_ratio_is_a_share() -> None:
    assert load_settings({"SIE_TRACING_SAMPLE_RATIO": "0.05"}).tracing.sample_ratio == 0.05
    with pytest.raises(ValueError, match="SIE_TRACING_SAMPLE_RATIO"):
        load_settings({"SIE_TRACING_SAMPLE_RATIO": "1.5"})


def test_the_otel_sampler_variables_choose_the_sampler() -> None:
    """OTEL_TRACES_SAMPLER names the spec's samplers; OTEL_TRACES_SAMPLER_ARG is the ratio, over
    SIE_TRACING_SAMPLE_RATIO; an unknown sampler is refused naming the variable."""
    from opentelemetry.sdk.trace.sampling import Decision
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context

    from sie.telemetry.tracing import build_sampler, sample_ratio

    settings = load_settings({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25",
                              "SIE_TRACING_SAMPLE_RATIO": "0.9"}).tracing  # fmt: skip
    assert (settings.sampler, sample_ratio(settings)) == ("traceidratio", 0.25)
    assert sample_ratio(load_settings({"SIE_TRACING_SAMPLE_RATIO": "0.9"}).tracing) == 0.9
    with pytest.raises(ValueError, match="OTEL_TRACES_SAMPLER"):
        load_settings({"OTEL_TRACES_SAMPLER": "jaeger_remote"})

    def decision(name: str, ratio: float, trace_id: int, parent_sampled: bool | None = None) -> bool:
        context = None
        if parent_sampled is not None:
            flags = TraceFlags(TraceFlags.SAMPLED if parent_sampled else TraceFlags.DEFAULT)
            parent = SpanContext(trace_id, 1, is_remote=True, trace_flags=flags)
            context = set_span_in_context(NonRecordingSpan(parent))
        result = build_sampler(name, ratio).should_sample(context, trace_id, "span")
        return result.decision == Decision.RECORD_AND_SAMPLE

    low, high = 1, (1 << 128) - 1  # trace ids the ratio keeps and drops
    assert decision("always_on", 0.0, high) and not decision("always_off", 1.0, low)
    assert decision("traceidratio", 0.5, low) and not decision("traceidratio", 0.5, high)
    assert decision("parentbased_always_off", 0.0, low, parent_sampled=True)  # the caller's decision stands
    assert not decision("parentbased_always_on", 1.0, low, parent_sampled=False)
    assert decision("always_on", 1.0, low, parent_sampled=False)  # not parent-based: records whatever the caller
