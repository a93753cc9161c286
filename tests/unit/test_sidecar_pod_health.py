"""HealthPublisher: heartbeat content, readiness from ping and publish freshness, drain, failures, the loop."""

from __future__ import annotations

import asyncio
import time

import attrs
import pytest

from sie.catalog.names import health_subject
from sie.sidecar.pod.health import FRESH_INTERVALS, MAX_FAILED_MODELS, HealthPublisher, WorkerIdentity, model_failure
from sie.wire.health import ModelFailure, WorkerHeartbeat
from sie.wire.ipc_control import (
    MODEL_STATE_FAILED,
    MODEL_STATE_LOADING_STARTED,
    MODEL_STATE_READY,
    MODEL_STATE_RETRY_LATER,
    EnsureModelReadyResponse,
    PingRequest,
    PingResponse,
)
from support.polling import eventually

IDENTITY = WorkerIdentity("worker-1", "pool-a", "L4", "default", device_count=2)
INTERVAL = 1.0


@attrs.define
class Acknowledged:
    """The acknowledged config as the publisher reads it (`sie.sidecar.live_config.LiveConfig` owns the real one)."""

    bundle_config_hash: str = ""


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeWorker:
    """Answers Ping with `response`; raises `error` or hangs when told to."""

    def __init__(self) -> None:
        self.response = PingResponse(
            timestamp_ms=0.0, worker_id="worker-1", ready=True, bundle_config_hash="h1",
            loaded_models=["m/loaded"], loading_models=["m/loading"],
        )  # fmt: skip
        self.error: Exception | None = None
        self.hang = False
        self.requests: list[PingRequest] = []

    async def ping(self, request: PingRequest) -> PingResponse:
        self.requests.append(request)
        if self.hang:
            await asyncio.Event().wait()
        if self.error is not None:
            raise self.error
        return self.response


class FakeBus:
    def __init__(self) -> None:
        self.published: list[tuple[str, WorkerHeartbeat]] = []
        self.error: Exception | None = None

    async def publish(self, subject: str, message: WorkerHeartbeat) -> None:
        if self.error is not None:
            raise self.error
        self.published.append((subject, message))


@pytest.fixture()
def clock() -> Clock:
    return Clock()


@pytest.fixture()
def worker() -> FakeWorker:
    return FakeWorker()


@pytest.fixture()
def bus() -> FakeBus:
    return FakeBus()


@pytest.fixture()
def publisher(bus: FakeBus, worker: FakeWorker, clock: Clock) -> HealthPublisher:
    return HealthPublisher(bus, worker, IDENTITY, INTERVAL, clock=clock)


async def test_beat_publishes_identity_and_worker_state(publisher, bus, worker) -> None:
    before = time.time()
    heartbeat = await publisher.beat()
    after = time.time()
    assert bus.published == [(health_subject("worker-1"), heartbeat)]
    (ping,) = worker.requests
    assert before * 1000 <= ping.timestamp_ms <= after * 1000
    assert before <= heartbeat.timestamp <= after
    assert heartbeat == WorkerHeartbeat(
        worker_id="worker-1", pool="pool-a", machine_profile="L4", bundle="default", ready=True,
        timestamp=heartbeat.timestamp, bundle_config_hash="h1", loaded_models=["m/loaded"],
        loading_models=["m/loading"], failed_models={}, draining=False, interval_s=INTERVAL, device_count=2,
    )  # fmt: skip
    assert publisher.ready


async def test_the_gpus_the_worker_reports_are_advertised_over_the_configured_count(publisher, worker) -> None:
    worker.response = attrs.evolve(worker.response, device_count=4)  # e.g. a pod of four CUDA children
    assert (await publisher.beat()).device_count == 4


async def test_an_acknowledged_config_hash_is_advertised_over_the_workers_own(bus, worker, clock) -> None:
    acknowledged = Acknowledged()
    publisher = HealthPublisher(bus, worker, IDENTITY, INTERVAL, acknowledged, clock=clock)
    assert (await publisher.beat()).bundle_config_hash == "h1"  # nothing acknowledged yet: the worker's
    acknowledged.bundle_config_hash = "h-acked"
    assert (await publisher.beat()).bundle_config_hash == "h-acked"


async def test_failed_ping_still_publishes_a_not_ready_heartbeat(publisher, bus, worker) -> None:
    await publisher.beat()
    worker.error = ConnectionResetError("worker gone")
    heartbeat = await publisher.beat()
    assert not heartbeat.ready and len(bus.published) == 2
    assert heartbeat.loaded_models == ["m/loaded"]  # the last known residency, for operators
    assert not publisher.ready
    worker.error = None
    assert (await publisher.beat()).ready and publisher.ready


async def test_worker_that_says_not_ready_is_not_ready(publisher, worker) -> None:
    worker.response = PingResponse(timestamp_ms=0.0, worker_id="worker-1", ready=False)
    assert not (await publisher.beat()).ready
    assert not publisher.ready


async def test_hung_ping_times_out_into_not_ready(bus, worker, clock) -> None:
    publisher = HealthPublisher(bus, worker, IDENTITY, 0.02, clock=clock)
    worker.hang = True
    heartbeat = await asyncio.wait_for(publisher.beat(), timeout=5.0)
    assert not heartbeat.ready and bus.published[-1][1] is heartbeat


async def test_readiness_needs_fresh_ping_and_fresh_heartbeat(publisher, clock) -> None:
    assert not publisher.ready  # nothing published yet
    await publisher.beat()
    clock.now += FRESH_INTERVALS * INTERVAL
    assert publisher.ready
    clock.now += 0.01
    assert not publisher.ready  # the loop stopped beating: stale


async def test_publish_failure_is_logged_and_readiness_follows_the_last_publish(publisher, bus, clock, caplog) -> None:
    await publisher.beat()
    bus.error = ConnectionError("broker down")
    clock.now += INTERVAL
    heartbeat = await publisher.beat()  # does not raise
    assert heartbeat.ready and publisher.ready  # the last heartbeat out is still fresh
    assert "publishing the heartbeat" in caplog.text
    clock.now += FRESH_INTERVALS * INTERVAL
    await publisher.beat()
    assert not publisher.ready  # pings fine, but the gateway has not heard from us for three intervals


async def test_drain_turns_heartbeat_and_readiness_off(publisher) -> None:
    await publisher.beat()
    publisher.begin_drain()
    assert publisher.draining and not publisher.ready
    heartbeat = await publisher.beat()
    assert heartbeat.draining and not heartbeat.ready


async def test_failures_are_reported_bounded_and_cleared(publisher, worker) -> None:
    failure = ModelFailure(error_class="NOT_FOUND", message="no weights", attempts=1, permanent=True)
    publisher.record_failure("m/broken", failure)
    assert (await publisher.beat()).failed_models == {"m/broken": failure}
    publisher.clear_failure("m/broken")
    publisher.clear_failure("m/never")
    assert (await publisher.beat()).failed_models == {}
    for index in range(MAX_FAILED_MODELS + 5):
        publisher.record_failure(f"m/{index}", failure)
    assert "m/4" not in publisher.failed_models  # the oldest went
    publisher.record_failure("m/5", failure)  # re-recording makes it the newest
    publisher.record_failure("m/new", failure)
    kept = publisher.failed_models
    assert len(kept) == MAX_FAILED_MODELS and "m/0" not in kept and "m/5" in kept and "m/6" not in kept


async def test_a_model_reported_loaded_is_no_longer_failed(publisher) -> None:
    publisher.record_failure("m/loaded", ModelFailure(error_class="NETWORK", message="x", permanent=False))
    assert (await publisher.beat()).failed_models == {}


def test_model_failure_from_ensure_model_ready() -> None:
    failed = EnsureModelReadyResponse(state=MODEL_STATE_FAILED, error="gone", error_class="NOT_FOUND", attempts=2)
    assert model_failure(failed) == ModelFailure(error_class="NOT_FOUND", message="gone", attempts=2, permanent=True)
    cooling = EnsureModelReadyResponse(state=MODEL_STATE_RETRY_LATER, error="oom", error_class="OOM")
    assert model_failure(cooling) == ModelFailure(error_class="OOM", message="oom", attempts=1, permanent=False)
    assert model_failure(EnsureModelReadyResponse(state=MODEL_STATE_FAILED)).error_class == "UNKNOWN"
    assert model_failure(EnsureModelReadyResponse(state=MODEL_STATE_RETRY_LATER)) is None  # unknown model
    assert model_failure(EnsureModelReadyResponse(state=MODEL_STATE_LOADING_STARTED)) is None


def test_observe_records_and_clears(publisher) -> None:
    publisher.observe("m/x", EnsureModelReadyResponse(state=MODEL_STATE_FAILED, error="e", error_class="GATED"))
    assert publisher.failed_models["m/x"].error_class == "GATED"
    publisher.observe("m/x", EnsureModelReadyResponse(state=MODEL_STATE_LOADING_STARTED))
    assert "m/x" in publisher.failed_models  # a retry in progress keeps the last error
    publisher.observe("m/x", EnsureModelReadyResponse(state=MODEL_STATE_READY))
    assert publisher.failed_models == {}


def test_interval_must_be_positive(bus, worker) -> None:
    with pytest.raises(ValueError, match="SIE_HEALTH_INTERVAL_S"):
        HealthPublisher(bus, worker, IDENTITY, 0.0)


async def test_loop_beats_every_interval_and_stops_on_exit(bus, worker) -> None:
    async with HealthPublisher(bus, worker, IDENTITY, 0.01) as publisher:
        await eventually(lambda: len(bus.published) >= 3)
        assert publisher.ready
    count = len(bus.published)
    await asyncio.sleep(0.05)  # not waiting for a condition: checking that nothing more happens
    assert len(bus.published) == count


async def test_drain_sends_a_heartbeat_at_once(bus, worker) -> None:
    async with HealthPublisher(bus, worker, IDENTITY, 60.0) as publisher:
        await eventually(lambda: len(bus.published) == 1)
        publisher.begin_drain()
        await eventually(lambda: len(bus.published) == 2)
        assert bus.published[-1][1].draining


async def test_loop_survives_a_failing_round(bus, worker, caplog) -> None:
    publisher = HealthPublisher(bus, worker, IDENTITY, 0.01)
    rounds = 0
    original = publisher._heartbeat

    def flaky(ready: bool) -> WorkerHeartbeat:
        nonlocal rounds
        rounds += 1
        if rounds == 1:
            raise RuntimeError("boom")
        return original(ready)

    publisher._heartbeat = flaky
    async with publisher:
        await eventually(lambda: len(bus.published) >= 2)
    assert "health heartbeat round failed" in caplog.text
