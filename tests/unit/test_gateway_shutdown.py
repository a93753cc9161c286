"""Graceful shutdown middleware and timing headers (contracts Part B §1.1, §1.8; seed 000 §16.2)."""

from __future__ import annotations

import asyncio

from sie.gateway.http.headers import response_headers
from sie.gateway.http.shutdown import ServingState, ShutdownMiddleware
from sie.gateway.metadata import ResponseMetadata, collect_metadata
from sie.wire import loads_json
from sie.wire.queue import WorkResult


class Held:
    """An ASGI app whose requests wait until released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.calls = 0

    async def __call__(self, scope, receive, send) -> None:
        self.calls += 1
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})


async def call(app, path: str) -> list[dict]:
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    await app({"type": "http", "path": path, "method": "POST", "headers": []}, receive, send)
    return sent


async def test_draining_refuses_new_requests_and_waits_for_in_flight_ones() -> None:
    inner, serving = Held(), ServingState()
    serving.started = True
    app = ShutdownMiddleware(inner, serving)
    in_flight = asyncio.ensure_future(call(app, "/v1/encode/m"))
    await asyncio.sleep(0)
    assert serving.in_flight == 1 and serving.ready

    serving.begin_shutdown()
    assert not serving.ready
    start, body = await call(app, "/v1/encode/m")
    headers = dict(start["headers"])
    assert (start["status"], headers[b"retry-after"], headers[b"x-sie-error-code"]) == (503, b"5", b"SHUTTING_DOWN")
    assert loads_json(body["body"])["error"]["code"] == "SHUTTING_DOWN"
    assert int(headers[b"content-length"]) == len(body["body"])

    assert await serving.drain(0.01) is False
    drained = asyncio.ensure_future(serving.drain(5.0))
    inner.release.set()
    assert await drained is True
    assert (await in_flight)[1]["body"] == b"done"
    assert inner.calls == 1 and serving.in_flight == 0


async def test_probes_pass_while_draining_and_openai_gets_its_envelope() -> None:
    inner, serving = Held(), ServingState()
    inner.release.set()
    serving.begin_shutdown()
    app = ShutdownMiddleware(inner, serving)
    assert (await call(app, "/healthz"))[0]["status"] == 200
    start, body = await call(app, "/v1/embeddings")
    assert start["status"] == 503
    assert loads_json(body["body"])["error"]["type"] == "server_error"


async def test_drain_with_nothing_in_flight_returns_at_once() -> None:
    assert await ServingState().drain(0.0) is True


def test_timing_headers_take_the_max_over_items() -> None:
    results = [
        WorkResult(work_item_id="r.0", request_id="r", item_index=0, success=True, queue_ms=1.0, inference_ms=9.5,
                   tokenization_ms=0.25, worker_id="w-1"),
        WorkResult(work_item_id="r.1", request_id="r", item_index=1, success=True, queue_ms=3.0, inference_ms=2.0,
                   postprocessing_ms=0.4),
    ]  # fmt: skip
    headers = response_headers(collect_metadata("r", results, 1.234, 14.6), 20.0)
    assert headers["x-sie-request-id"] == "r"
    assert (headers["x-queue-publish-time"], headers["x-queue-wait-time"], headers["x-queue-time"]) == (
        "1.23", "14.60", "3.00",
    )  # fmt: skip
    assert (headers["x-inference-time"], headers["x-tokenization-time"]) == ("9.50", "0.25")
    assert (headers["x-postprocessing-time"], headers["x-total-time"], headers["x-sie-worker"]) == (
        "0.40",
        "20.00",
        "w-1",
    )
    assert headers["x-sie-version"] == headers["x-sie-server-version"]


def test_optional_timing_headers_are_left_out_when_zero() -> None:
    headers = response_headers(ResponseMetadata("r"), 1.0)
    assert "x-postprocessing-time" not in headers and "x-payload-fetch-time" not in headers
    assert "x-sie-worker" not in headers
