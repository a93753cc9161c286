"""WorkerRegistry: last-heartbeat-wins, staleness and pruning on an injected clock, state precedence, lanes."""

from __future__ import annotations

import asyncio

import pytest

from sie.catalog.names import HEALTH_WILDCARD, health_subject
from sie.gateway.registry import WorkerRegistry, first_heartbeat_round_s
from sie.gateway.status import (
    STATE_AVAILABLE,
    STATE_FAILED,
    STATE_LOADED,
    STATE_LOADING,
    LastError,
    ModelStatusSource,
    WorkerSummary,
)
from sie.sidecar.pod.health import PING_TIMEOUT_INTERVALS
from sie.transport.base import Lane, TransportUnavailable
from sie.transport.loopback import LoopbackTransport
from sie.wire.health import ModelFailure, WorkerHeartbeat

STALE_S = 10.0
MODEL = "org/model"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def beat(worker_id: str = "w1", timestamp: float = 1.0, **fields) -> WorkerHeartbeat:
    base = dict(worker_id=worker_id, pool="default", machine_profile="L4", bundle="default", ready=True)
    base.update(fields)
    return WorkerHeartbeat(timestamp=timestamp, **base)


def failure(message: str = "boom", attempts: int = 1, error_class: str = "NOT_FOUND") -> ModelFailure:
    return ModelFailure(error_class=error_class, message=message, attempts=attempts, permanent=True)


class NullBus:
    """Records the one subscription; the tests feed heartbeats through `observe`."""

    def __init__(self) -> None:
        self.subscriptions: list[tuple[str, type | None]] = []

    async def subscribe(self, subject, handler, message_type=None):
        self.subscriptions.append((subject, message_type))
        return self

    async def unsubscribe(self) -> None:
        self.subscriptions.clear()


@pytest.fixture()
def clock() -> Clock:
    return Clock()


@pytest.fixture()
def registry(clock: Clock) -> WorkerRegistry:
    return WorkerRegistry(NullBus(), STALE_S, clock=clock)


def test_is_a_model_status_source(registry: WorkerRegistry) -> None:
    source: ModelStatusSource = registry
    assert source.status(MODEL) == (STATE_AVAILABLE, None)
    assert source.workers() == []


async def test_subscribes_to_heartbeats_over_the_bus(clock: Clock) -> None:
    async with LoopbackTransport() as transport:
        async with WorkerRegistry(transport, STALE_S, clock=clock) as registry:
            await transport.publish(health_subject("w/1"), beat("w/1", loaded_models=[MODEL]))
            await transport.publish(health_subject("w2"), {"not": "a heartbeat"})  # dropped, never raises
            assert [worker.name for worker in registry.workers()] == ["w/1"]
            assert registry.status(MODEL) == (STATE_LOADED, None)
        await transport.publish(health_subject("w3"), beat("w3"))  # after exit: not subscribed any more
        assert [worker.name for worker in registry.workers()] == ["w/1"]


async def test_subscription_asks_for_the_heartbeat_type(clock: Clock) -> None:
    bus = NullBus()
    async with WorkerRegistry(bus, STALE_S, clock=clock):
        assert bus.subscriptions == [(HEALTH_WILDCARD, WorkerHeartbeat)]
    assert bus.subscriptions == []


def test_last_heartbeat_wins_by_timestamp(registry: WorkerRegistry, clock: Clock) -> None:
    assert registry.observe(beat(timestamp=5.0, loaded_models=[MODEL]))
    assert not registry.observe(beat(timestamp=4.0))  # late arrival of an older heartbeat
    assert registry.status(MODEL)[0] == STATE_LOADED
    assert registry.observe(beat(timestamp=5.0))  # same stamp: the later one wins
    assert registry.status(MODEL)[0] == STATE_AVAILABLE


def test_a_restarted_worker_with_an_older_clock_is_accepted_once_stale(registry: WorkerRegistry, clock) -> None:
    registry.observe(beat(timestamp=500.0))
    clock.now += STALE_S + 1
    assert registry.observe(beat(timestamp=400.0, loaded_models=[MODEL]))
    assert registry.status(MODEL)[0] == STATE_LOADED


def test_staleness_and_pruning(registry: WorkerRegistry, clock: Clock) -> None:
    registry.observe(beat(loaded_models=[MODEL]))
    clock.now += STALE_S
    assert registry.healthy_workers() and registry.status(MODEL)[0] == STATE_LOADED
    clock.now += 0.001
    assert registry.healthy_workers() == []
    assert registry.status(MODEL) == (STATE_AVAILABLE, None)
    assert registry.workers() == [
        WorkerSummary(name="w1", pool="default", machine_profile="L4", bundle="default", healthy=False,
                      loaded_models=(MODEL,))
    ]  # fmt: skip
    clock.now += registry.prune_after_s
    assert registry.workers() == []  # long dead: not listed even before it is pruned
    assert registry.prune() == 1


def test_pruning_happens_while_heartbeats_arrive(registry: WorkerRegistry, clock: Clock) -> None:
    registry.observe(beat("dead"))
    clock.now += registry.prune_after_s + 1
    registry.observe(beat("alive"))
    assert list(registry._workers) == ["alive"]


@pytest.mark.parametrize("fields", [{"ready": False}, {"draining": True}])
def test_not_ready_or_draining_is_unhealthy(registry: WorkerRegistry, fields) -> None:
    registry.observe(beat(loaded_models=[MODEL], **fields))
    assert registry.healthy_workers() == []
    assert registry.status(MODEL)[0] == STATE_AVAILABLE
    assert [worker.healthy for worker in registry.workers()] == [False]


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        ({"loading_models": [MODEL]}, {"loaded_models": [MODEL]}, STATE_LOADING),
        ({"loaded_models": [MODEL]}, {"failed_models": {MODEL: failure()}}, STATE_LOADED),
        ({"failed_models": {MODEL: failure()}}, {}, STATE_FAILED),
        ({}, {"loaded_models": ["other/model"]}, STATE_AVAILABLE),
        ({"loaded_models": [MODEL], "ready": False}, {"failed_models": {MODEL: failure()}}, STATE_FAILED),
    ],
)
def test_state_precedence_across_healthy_workers(registry: WorkerRegistry, first, second, expected) -> None:
    registry.observe(beat("w1", **first))
    registry.observe(beat("w2", **second))
    assert registry.status(MODEL)[0] == expected


def test_failed_carries_the_newest_failure(registry: WorkerRegistry, clock: Clock) -> None:
    registry.observe(beat("w1", failed_models={MODEL: failure("first")}))
    clock.now += 1
    registry.observe(beat("w2", failed_models={MODEL: failure("second", error_class="NETWORK")}))
    assert registry.status(MODEL) == (STATE_FAILED, LastError("NETWORK", "second", 1, True))
    clock.now += 1
    registry.observe(beat("w1", timestamp=2.0, failed_models={MODEL: failure("first")}))  # unchanged: still older
    assert registry.status(MODEL)[1].message == "second"
    clock.now += 1
    registry.observe(beat("w1", timestamp=3.0, failed_models={MODEL: failure("first", attempts=2)}))
    assert registry.status(MODEL)[1] == LastError("NOT_FOUND", "first", 2, True)


def test_loading_keeps_the_last_error_and_loaded_clears_it(registry: WorkerRegistry) -> None:
    registry.observe(beat("w1", loading_models=[MODEL], failed_models={MODEL: failure()}))
    assert registry.status(MODEL) == (STATE_LOADING, LastError("NOT_FOUND", "boom", 1, True))
    registry.observe(beat("w2", loaded_models=[MODEL]))
    registry.observe(beat("w1", timestamp=2.0, failed_models={MODEL: failure()}))
    assert registry.status(MODEL) == (STATE_LOADED, None)


def test_healthy_workers_filters_by_lane(registry: WorkerRegistry) -> None:
    registry.observe(beat("a", pool="p1", machine_profile="L4", bundle="default"))
    registry.observe(beat("b", pool="p1", machine_profile="a100-80gb", bundle="sglang"))
    registry.observe(beat("c", pool="p2", machine_profile="L4", bundle="default"))
    registry.observe(beat("d", pool="p1", machine_profile="L4", bundle="default", ready=False))

    def names(**lane) -> list[str]:
        return sorted(heartbeat.worker_id for heartbeat in registry.healthy_workers(**lane))

    assert names() == ["a", "b", "c"]
    assert names(pool="p1") == ["a", "b"]
    assert names(machine_profile="l4") == ["a", "c"]  # profiles match in any case
    assert names(machine_profile="A100-80GB", bundle="sglang") == ["b"]
    assert names(bundle="Default") == []  # bundles match exactly (seed 000 §6)
    assert names(pool="p1", machine_profile="L4", bundle="default") == ["a"]
    assert registry.lanes_with_healthy_workers() == {
        Lane("p1", "L4", "default"),
        Lane("p1", "a100-80gb", "sglang"),
        Lane("p2", "L4", "default"),
    }


def test_workers_summary(registry: WorkerRegistry) -> None:
    registry.observe(beat("b", device_count=4, loaded_models=[MODEL]))
    registry.observe(beat("a"))
    assert [(worker.name, worker.gpu_count, worker.loaded_models) for worker in registry.workers()] == [
        ("a", 0, ()),
        ("b", 4, (MODEL,)),
    ]


def test_stale_time_must_be_positive() -> None:
    with pytest.raises(ValueError, match="SIE_GATEWAY_WORKER_STALE_S"):
        WorkerRegistry(NullBus(), 0.0)


async def test_has_consumer_raises_while_the_bus_cannot_deliver_heartbeats(clock: Clock) -> None:
    reason: list[str | None] = ["NATS is not connected (connection refused)"]
    registry = WorkerRegistry(
        NullBus(), STALE_S, clock=clock, unavailable=lambda: reason[0], first_heartbeat_wait_s=0.0
    )
    lane = Lane("default", "L4", "default")
    with pytest.raises(TransportUnavailable, match="connection refused"):
        await registry.has_consumer(lane)

    reason[0] = None
    assert not await registry.has_consumer(lane)
    registry.observe(beat())
    assert await registry.has_consumer(lane)


LANE = Lane("default", "L4", "default")


async def test_a_worker_heard_ready_within_the_stale_time_serves_its_lane_while_it_says_not_ready(
    clock: Clock,
) -> None:
    # Its backend restarting: the lane stays served (work waits in the stream), not PROVISIONING (issue 13 §4).
    registry = WorkerRegistry(NullBus(), STALE_S, clock=clock, first_heartbeat_wait_s=0.0)
    registry.observe(beat(timestamp=1.0))
    clock.now += 4
    registry.observe(beat(timestamp=2.0, ready=False))
    assert not registry.healthy_workers() and await registry.has_consumer(LANE)
    clock.now += STALE_S - 4
    registry.observe(beat(timestamp=3.0, ready=False))
    assert await registry.has_consumer(LANE)
    clock.now += 0.001
    assert not await registry.has_consumer(LANE)  # not ready for longer than the stale time


@pytest.mark.parametrize("fields", [{"ready": False}, {"draining": True}])
async def test_a_worker_never_ready_or_draining_does_not_serve_its_lane(clock: Clock, fields) -> None:
    registry = WorkerRegistry(NullBus(), STALE_S, clock=clock, first_heartbeat_wait_s=0.0)
    if fields.get("draining"):
        registry.observe(beat(timestamp=1.0))
    registry.observe(beat(timestamp=2.0, **fields))
    assert not await registry.has_consumer(LANE)


async def test_a_registry_that_just_started_waits_for_the_lanes_heartbeats(clock: Clock) -> None:
    async with WorkerRegistry(NullBus(), STALE_S, clock=clock, first_heartbeat_wait_s=60.0) as registry:
        asked = asyncio.ensure_future(registry.has_consumer(LANE))
        await asyncio.sleep(0)
        registry.observe(beat(worker_id="other", bundle="other"))  # another lane's: still waiting
        await asyncio.sleep(0)
        assert not asked.done()
        registry.observe(beat())
        assert await asked


async def test_past_its_first_heartbeat_wait_a_registry_calls_a_lane_unserved(clock: Clock) -> None:
    async with WorkerRegistry(NullBus(), STALE_S, clock=clock, first_heartbeat_wait_s=60.0) as registry:
        clock.now += 60.0
        assert not await registry.has_consumer(LANE)


async def test_ready_once_a_first_round_of_heartbeats_has_passed_with_or_without_workers(clock: Clock) -> None:
    registry = WorkerRegistry(NullBus(), STALE_S, clock=clock, first_heartbeat_wait_s=2.5)
    assert registry.routing_reason() == "not subscribed to worker heartbeats"
    async with registry:
        assert registry.routing_reason() == "waiting 2.5 s more for the workers' first heartbeats"
        clock.now += 2.4
        registry.observe(beat())  # one worker heard: others may still be on their way
        assert registry.routing_reason() == "waiting 0.1 s more for the workers' first heartbeats"
        clock.now += 0.1
        assert registry.routing_reason() is None
        # Ready: an unserved lane is answered at once, the served one too.
        assert not await registry.has_consumer(Lane("default", "L4", "other"))
        assert await registry.has_consumer(LANE)


async def test_a_registry_with_no_workers_becomes_ready_after_the_first_round(clock: Clock) -> None:
    async with WorkerRegistry(NullBus(), STALE_S, clock=clock, first_heartbeat_wait_s=2.5) as registry:
        clock.now += 2.5
        assert registry.routing_reason() is None
        assert not await registry.has_consumer(LANE)  # scale-from-zero: PROVISIONING


async def test_the_first_round_starts_when_the_bus_can_deliver_and_again_after_an_outage(clock: Clock) -> None:
    reason: list[str | None] = ["NATS is not connected (connection refused)"]
    registry = WorkerRegistry(
        NullBus(), STALE_S, clock=clock, unavailable=lambda: reason[0], first_heartbeat_wait_s=2.5
    )
    async with registry:
        clock.now += 10.0
        assert registry.routing_reason() == "NATS is not connected (connection refused)"
        reason[0] = None
        assert registry.routing_reason() == "waiting 2.5 s more for the workers' first heartbeats"
        clock.now += 2.5
        assert registry.routing_reason() is None
        reason[0] = "NATS is not connected (connection reset)"
        assert registry.routing_reason() == reason[0]
        reason[0] = None
        assert registry.routing_reason() == "waiting 2.5 s more for the workers' first heartbeats"


def test_the_first_round_lasts_long_enough_for_a_beat_delayed_by_its_ping() -> None:
    # A sidecar's ping gives up after two intervals (sie.sidecar.pod.health): the round is longer than that.
    assert first_heartbeat_round_s(1.0) > PING_TIMEOUT_INTERVALS * 1.0
    assert first_heartbeat_round_s(4.0) == 4 * first_heartbeat_round_s(1.0)


async def test_only_workers_with_the_expected_config_and_in_the_pool_are_eligible(clock: Clock) -> None:
    registry = WorkerRegistry(NullBus(), STALE_S, clock=clock, first_heartbeat_wait_s=0.05)
    registry.observe(beat("w-new", bundle_config_hash="a" * 64))
    registry.observe(beat("w-old", bundle_config_hash="b" * 64))
    registry.observe(beat("w-legacy"))  # reports no hash: legacy, always eligible
    assert registry.eligible_workers(LANE, "a" * 64) == ["w-legacy", "w-new"]
    assert registry.eligible_workers(LANE) == ["w-legacy", "w-new", "w-old"]  # nothing expected: all
    assert registry.eligible_workers(LANE, "a" * 64, frozenset({"w-old", "w-new"})) == ["w-new"]
    assert await registry.has_consumer(LANE, "a" * 64, frozenset({"w-new"}))
    # Only a worker holding another config: not served (after a short wait for it to apply the expected one).
    assert not await registry.has_consumer(LANE, "a" * 64, frozenset({"w-old"}))
    assert not await registry.has_consumer(LANE, "c" * 64, frozenset({"w-old", "w-new"}))
    assert registry.eligible_workers(Lane("default", "a100", "default")) == []


async def test_the_live_workers_are_every_one_heard_within_the_prune_time_once_the_first_round_is_over() -> None:
    """What the sweep of gone workers' streams keeps: a worker not ready, silent past its stale time, is still live."""
    clock = Clock()
    start = clock.now
    registry = WorkerRegistry(NullBus(), STALE_S, prune_after_s=60.0, clock=clock, first_heartbeat_wait_s=2.5)
    async with registry:
        registry.observe(beat("quiet", ready=False))
        clock.now = start + 2.0
        registry.observe(beat("pod.1"))
        assert registry.live_worker_ids() is None  # the first round of heartbeats is not over
        clock.now = start + 59.0
        assert registry.live_worker_ids() == {"quiet", "pod.1"}
        clock.now = start + 61.0
        assert registry.live_worker_ids() == {"pod.1"}
