"""Traces across real processes, received by an OTLP/HTTP collector: one request's spans from the gateway, sidecar and
worker processes (or the one `--role all` process) continue the caller's trace and nest as the request moved through
them; with tracing off nothing is exported although a collector is configured."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from launcher import MINILM, RoleProcess, free_port, serving_cluster
from support.otlp import OtlpReceiver, ReceivedSpan, otlp_receiver
from support.polling import holds_within

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
SMOLLM = "HuggingFaceTB/SmolLM2-135M-Instruct"
SIDECAR_SPANS = ("sidecar.prepare", "sidecar.batch_wait", "sidecar.dispatch")
REQUEST_SPANS = ("gateway.request", *SIDECAR_SPANS, "worker.run_batch")


def _encode_traced(url: str) -> httpx.Response:
    body = {"items": [{"text": "a sentence somebody wants to follow"}]}
    return httpx.post(f"{url}/v1/encode/{MINILM}", json=body, headers={"traceparent": TRACEPARENT}, timeout=60)


def _request_spans(receiver: OtlpReceiver, logs: str = "") -> dict[str, ReceivedSpan]:
    """The spans of the caller's trace by name, once every span of the request has been exported."""

    def received() -> dict[str, ReceivedSpan]:
        return {span.name: span for span in receiver.spans() if span.trace_id == CLIENT_TRACE}

    if not holds_within(lambda: set(REQUEST_SPANS) <= set(received()), 60.0, interval_s=0.2):
        raise AssertionError(f"spans of the request not all received: {sorted(received())}\n{logs}")
    return received()


def _assert_parent_chain(spans: dict[str, ReceivedSpan]) -> None:
    """caller → gateway.request → the sidecar's stages → (dispatch) → worker.run_batch."""
    gateway = spans["gateway.request"]
    assert gateway.parent_span_id == CLIENT_SPAN
    for name in SIDECAR_SPANS:
        assert spans[name].parent_span_id == gateway.span_id, name
    assert spans["worker.run_batch"].parent_span_id == spans["sidecar.dispatch"].span_id
    assert spans["worker.run_batch"].attributes["sie.model"] == MINILM
    assert spans["worker.run_batch"].attributes["sie.batch_size"] == 1


@contextmanager
def _all_role(root: Path, env: Mapping[str, str]) -> Iterator[tuple[RoleProcess, str]]:
    """`sie run --role all` with MiniLM preloaded and `env`, serving; stopped (SIGTERM) when the block ends."""
    port = free_port()
    args = ["--host", "127.0.0.1", "--port", str(port), "--preload", MINILM]
    server = RoleProcess("all", args, env, root / "all.log")
    try:
        url = f"http://127.0.0.1:{port}"
        server.wait_http_ready(f"{url}/readyz")
        yield server, url
    finally:
        server.stop()


@pytest.mark.slow
def test_one_requests_spans_from_gateway_sidecar_and_worker_processes_continue_the_callers_trace(
    tmp_path: Path,
) -> None:
    with otlp_receiver() as receiver:
        tracing = {"SIE_TRACING_ENABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url}
        with serving_cluster(tmp_path, role_env=tracing) as cluster:
            response = _encode_traced(cluster.url)
            assert response.status_code == 200, response.text
            assert response.headers["x-trace-id"] == CLIENT_TRACE
            spans = _request_spans(receiver, cluster.logs())
            processes = {
                "gateway.request": cluster.gateway.process.pid,
                **{name: cluster.sidecar.process.pid for name in SIDECAR_SPANS},
                "worker.run_batch": cluster.worker.process.pid,
            }
    _assert_parent_chain(spans)
    assert {name: span.pid for name, span in spans.items()} == processes
    assert spans["gateway.request"].service == "sie-gateway"
    assert spans["sidecar.dispatch"].service == "sie-sidecar"
    assert spans["worker.run_batch"].service == "sie-worker"


@pytest.fixture(scope="module")
def traced_all(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[OtlpReceiver, RoleProcess, str]]:
    """One `sie run --role all` with tracing on, exporting to a receiver: the two all-role tests below share it (each
    reads the spans it caused by name)."""
    with otlp_receiver() as receiver:
        tracing = {"SIE_TRACING_ENABLED": "true", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{receiver.url}/v1/traces"}
        with _all_role(tmp_path_factory.mktemp("traced-all"), tracing) as (server, url):
            yield receiver, server, url


@pytest.mark.slow
def test_the_all_role_traces_the_same_chain_in_its_one_process(
    traced_all: tuple[OtlpReceiver, RoleProcess, str],
) -> None:
    receiver, server, url = traced_all
    response = _encode_traced(url)
    assert response.status_code == 200, response.text
    assert response.headers["x-trace-id"] == CLIENT_TRACE
    spans = _request_spans(receiver, server.log())
    _assert_parent_chain(spans)
    assert {span.service for span in spans.values()} == {"sie-all"}
    assert {span.pid for span in spans.values()} == {server.process.pid}


@pytest.mark.slow
def test_a_streamed_chat_generation_is_a_proxy_span_with_the_workers_streaming_span_under_it(
    traced_all: tuple[OtlpReceiver, RoleProcess, str],
) -> None:
    """Seed 000 §15.1: `gateway.proxy_chat` continues the caller's trace for as long as the stream runs, and the
    worker's `worker.streaming_processor` nests under it (the work item carried its context)."""
    receiver, server, url = traced_all
    body = {"model": SMOLLM, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "stream": True}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, headers={"traceparent": TRACEPARENT}, timeout=60)
    assert response.status_code == 200 and response.text.endswith("data: [DONE]\n\n"), response.text
    assert response.headers["x-trace-id"] == CLIENT_TRACE

    def received() -> dict[str, ReceivedSpan]:
        return {span.name: span for span in receiver.spans() if span.trace_id == CLIENT_TRACE}

    names = {"gateway.proxy_chat", "worker.streaming_processor"}
    assert holds_within(lambda: names <= set(received()), 60.0, interval_s=0.2), server.log()
    spans = received()
    proxy, worker = spans["gateway.proxy_chat"], spans["worker.streaming_processor"]
    assert proxy.parent_span_id == CLIENT_SPAN
    assert worker.parent_span_id == proxy.span_id
    assert worker.attributes["sie.model"] == SMOLLM and worker.attributes["sie.adapter"] == "causal_lm"
    assert worker.attributes["sie.request_id"] == proxy.attributes["sie.request_id"]


@pytest.mark.slow
def test_with_tracing_off_no_span_is_exported(tmp_path: Path) -> None:
    with otlp_receiver() as receiver:
        collector = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{receiver.url}/v1/traces"}  # only the switch is off
        with _all_role(tmp_path, collector) as (server, url):
            for _ in range(3):
                response = _encode_traced(url)
                assert response.status_code == 200, response.text
                assert "x-trace-id" not in response.headers
        # The role has stopped: had a provider existed, its shutdown would have flushed the spans by now.
        assert server.process.returncode == 0, server.log()
        assert receiver.post_count() == 0
